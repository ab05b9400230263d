#!/usr/bin/env bash
# CI for the Nix side, runnable offline on a machine with no nixpkgs and no fetched inputs:
#   1. installs Nix with .ci/install-nix.sh (a private prefix) when `nix` is missing;
#   2. parses every .nix file of the repository (nix-instantiate --parse);
#   3. runs the Nix-level tests and the evaluation invariants (nix/tests/run.nix);
#   4. runs nix/scripts/dist-info-edit.sh with the commands nix/lib generates from policy.toml on
#      fixture dist-infos (test doubles of installed wheels), and host-driver.sh on a fake host tree.
# Ends with a pytest-like line "N passed, M failed"; exits non-zero when anything failed.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

if ! command -v nix-instantiate >/dev/null; then
  exports=$(bash "$repo/.ci/install-nix.sh" | grep '^export ') || { echo "installing Nix with .ci/install-nix.sh failed"; exit 1; }
  eval "$exports"
fi
NIX=(nix --extra-experimental-features 'nix-command flakes')

passed=0 failed=0
ok() { passed=$((passed + 1)); echo "PASSED $1"; }
bad() { failed=$((failed + 1)); echo "FAILED $1: $2"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. every .nix file parses
while IFS= read -r f; do
  if err=$(nix-instantiate --parse "$f" 2>&1 >/dev/null); then ok "parse $f"; else bad "parse $f" "$err"; fi
done < <(git ls-files --cached --others --exclude-standard -- '*.nix')

# 2. Nix-level tests + invariants
if json=$(nix-instantiate --eval --strict --json nix/tests/run.nix 2>"$tmp/err"); then
  while IFS=$'\t' read -r status name msg; do
    if [ "$status" = ok ]; then ok "$name"; else bad "$name" "$msg"; fi
  done < <(python3 -c 'import json,sys
for t in json.load(sys.stdin): print("ok" if t["ok"] else "fail", t["name"], t["message"], sep="\t")' <<<"$json")
else
  bad "nix/tests/run.nix" "$(cat "$tmp/err")"
fi

# 3. metadata edits generated from policy.toml, applied to fixture dist-infos
mkdist() { # DIR NAME VERSION REQUIRES... : a fixture dist-info with METADATA and RECORD
  local site=$1 name=$2 version=$3; shift 3
  local info=$site/${name//-/_}-$version.dist-info
  mkdir -p "$info"
  { echo "Metadata-Version: 2.1"; echo "Name: $name"; echo "Version: $version"
    for r in "$@"; do echo "Requires-Dist: $r"; done
    echo; echo "Description line mentioning Requires-Dist: numpy<2.0.0 in the body"; } > "$info/METADATA"
  printf '%s\n' "${info##*/}/METADATA,sha256=stale,1" "${info##*/}/RECORD,," > "$info/RECORD"
}
site=$tmp/site
mkdist "$site" verl 0.8.0 "numpy<2.0.0" "ray[default]"
mkdist "$site" trinity-rft 0.6.0 "sqlalchemy" "ray[default]"
mkdist "$site" torch 2.11.0+cu128 "filelock" "nvidia-cudnn-cu12==9.10.2.21; platform_system == \"Linux\"" "cuda-toolkit[cudart]==12.8.90" "nvidia-ml-py"
gen() { "${NIX[@]}" eval --raw --impure --expr "let rs = import $repo/nix/lib { policyFile = $repo/python/rftstack/data/policy.toml; lockFile = $repo/uv.lock; }; a = { script = \"$repo/nix/scripts/dist-info-edit.sh\"; python = \"python3\"; site = \"$site\"; }; in $1"; }
expect_meta() { # NAME DIST-INFO WANT-PYTHON-EXPR
  if python3 - "$2" "$3" <<'PY'
import base64, hashlib, sys, pathlib
info = pathlib.Path(sys.argv[1]); meta = (info / "METADATA").read_text()
head = meta.split("\n\n", 1)[0].splitlines()
req = [l[len("Requires-Dist: "):] for l in head if l.startswith("Requires-Dist: ")]
data = (info / "METADATA").read_bytes()
digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
record = (info / "RECORD").read_text()
assert f"{info.name}/METADATA,sha256={digest},{len(data)}" in record, record
assert "numpy<2.0.0 in the body" in meta, "body changed"
assert eval(sys.argv[2]), req
PY
  then ok "$1"; else bad "$1" "METADATA/RECORD not as expected"; fi
}
for d in verl trinity-rft; do
  if cmd=$(gen "rs.lib.policyLib.editCommand a \"$d\" rs.edits.\"$d\"" 2>"$tmp/err") && bash -c "$cmd" 2>"$tmp/err"; then
    ok "dist-info-edit $d runs"
  else bad "dist-info-edit $d runs" "$(cat "$tmp/err")"; fi
done
expect_meta "relax verl numpy line" "$site/verl-0.8.0.dist-info" 'req == ["numpy<2.4,>=2", "ray[default]"]'
expect_meta "add greenlet to trinity-rft" "$site/trinity_rft-0.6.0.dist-info" 'req == ["sqlalchemy", "ray[default]", "greenlet>=3"]'
if cmd=$(gen 'rs.lib.policyLib.stripCommand a rs.policy "torch" rs.artifacts.torch.version') && bash -c "$cmd" 2>"$tmp/err"; then
  ok "strip cu12 wheel requirements from torch"; else bad "strip cu12 wheel requirements from torch" "$(cat "$tmp/err")"; fi
expect_meta "torch keeps non-CUDA requirements" "$site/torch-2.11.0+cu128.dist-info" 'req == ["filelock", "nvidia-ml-py"]'
# A second run must refuse: the upstream line is gone, so the policy no longer matches.
if bash -c "$(gen 'rs.lib.policyLib.editCommand a "verl" rs.edits.verl')" 2>/dev/null; then
  bad "edit refuses metadata that does not match policy" "second run succeeded"
else ok "edit refuses metadata that does not match policy"; fi

# 3b. policy [[patch]]: the command nix/lib generates (patches.py --dist), run on a fixture site whose
# torch/distributed/rendezvous.py holds the unpatched side of every hunk (a test double of the
# installed file: the hunks' context only) and a torch 2.11.0+cu128 dist-info (the driver-570 build).
psite=$tmp/psite
mkdir -p "$psite/torch/distributed" "$psite/torch-2.11.0+cu128.dist-info"
printf 'Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0+cu128\n' > "$psite/torch-2.11.0+cu128.dist-info/METADATA"
python3 - "$repo/patches/torch-tcpstore-loopback.patch" "$psite" <<'PY'
import sys, pathlib
sys.path.insert(0, "python/rftstack/stack")
import patches
site = pathlib.Path(sys.argv[2])
for fp in patches.parse(pathlib.Path(sys.argv[1]).read_text()):
    body = "\n# ---- fixture gap ----\n".join("\n".join(h.before) for h in fp.hunks) + "\n"
    (site / fp.path).write_text(body)
    (site / "torch-2.11.0+cu128.dist-info/RECORD").write_text(f"{fp.path},sha256=stale,1\n")
PY
pgen() { "${NIX[@]}" eval --raw --impure --expr "let rs = import $repo/nix/lib { policyFile = $repo/python/rftstack/data/policy.toml; lockFile = $repo/uv.lock; patchesDir = $repo/patches; }; in rs.lib.policyLib.patchCommand { tool = \"$repo/python/rftstack/stack\"; python = \"python3\"; site = \"$psite\"; policyFile = \"$repo/python/rftstack/data/policy.toml\"; patchesDir = \"$repo/patches\"; } \"torch\""; }
rdv=$psite/torch/distributed/rendezvous.py
if pcmd=$(pgen 2>"$tmp/err") && out=$(bash -c "$pcmd" 2>"$tmp/err") && grep -q "_loopback_listen_fd" "$rdv" \
   && grep -q "^torch/distributed/rendezvous.py,sha256=$(python3 -c 'import base64,hashlib,sys; print(base64.urlsafe_b64encode(hashlib.sha256(open(sys.argv[1],"rb").read()).digest()).rstrip(b"=").decode())' "$rdv")," "$psite/torch-2.11.0+cu128.dist-info/RECORD"; then
  ok "patch torch from policy [[patch]] (RECORD re-hashed)"; else bad "patch torch from policy [[patch]]" "$out $(cat "$tmp/err")"; fi
if out=$(bash -c "$pcmd" 2>&1) && [[ "$out" == *"already applied"* ]]; then ok "patch is idempotent"; else bad "patch is idempotent" "$out"; fi
sed -i 's/start_daemon = rank == 0/start_daemon = rank == 1/' "$rdv"
if bash -c "$pcmd" >/dev/null 2>"$tmp/err"; then bad "patch refuses a file matching neither side" "it succeeded"
elif grep -q "matches neither" "$tmp/err"; then ok "patch refuses a file matching neither side"; else bad "patch refuses a file matching neither side" "$(cat "$tmp/err")"; fi

# 4. host driver discovery on fake host trees (test doubles: empty files named like the libs)
host=$tmp/host
mkdir -p "$host/usr/lib/x86_64-linux-gnu" "$host/nixos/run/opengl-driver/lib"
touch "$host/usr/lib/x86_64-linux-gnu/"{libcuda.so.1,libcuda.so.570.195.03,libnvidia-ml.so.1,libnvidia-ptxjitcompiler.so.1,libc.so.6,libstdc++.so.6}
touch "$host/nixos/run/opengl-driver/lib/libcuda.so.1"
fake_ldconfig=$tmp/ldconfig; printf '#!/bin/sh\necho "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1"\n' > "$fake_ldconfig"; chmod +x "$fake_ldconfig"
d=$(RFTSTACK_HOST_ROOT=$host RFTSTACK_LDCONFIG=$fake_ldconfig XDG_CACHE_HOME=$tmp/cache bash nix/scripts/host-driver.sh)
if [ -e "$d/libcuda.so.1" ] && [ -e "$d/libnvidia-ml.so.1" ] && [ ! -e "$d/libc.so.6" ] && [ ! -e "$d/libstdc++.so.6" ]; then
  ok "ubuntu: only driver libs linked from ldconfig's libcuda dir"; else bad "ubuntu: only driver libs linked" "got $d: $(ls "$d" 2>&1)"; fi
d=$(RFTSTACK_HOST_ROOT=$host RFTSTACK_LDCONFIG=false XDG_CACHE_HOME=$tmp/cache2 bash nix/scripts/host-driver.sh)
if [ -e "$d/libcuda.so.1" ] && [ ! -e "$d/libc.so.6" ]; then ok "ubuntu without ldconfig: known path"; else bad "ubuntu without ldconfig: known path" "got $d"; fi
d=$(RFTSTACK_HOST_ROOT=$host/nixos RFTSTACK_LDCONFIG=false bash nix/scripts/host-driver.sh)
if [ "$d" = "$host/nixos/run/opengl-driver/lib" ]; then ok "nixos: /run/opengl-driver/lib"; else bad "nixos: /run/opengl-driver/lib" "got $d"; fi
if d=$(RFTSTACK_HOST_ROOT=$tmp/empty RFTSTACK_LDCONFIG=false bash nix/scripts/host-driver.sh); then
  bad "no driver: returns 1" "got '$d'"; else ok "no driver: returns 1"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
