#!/usr/bin/env bash
# Edit the METADATA of one installed distribution and re-hash it in RECORD, as the policy asks.
# Called from derivations (postInstall) with arguments generated from policy.toml by
# nix/lib/policy.nix (editCommand / stripCommand); also run directly by nix/ci-check.sh on a
# fixture dist-info.
#
# Usage: dist-info-edit.sh PYTHON SITE DIST VERSION [--replace WAS NOW]... [--add REQ]... [--strip ERE]...
#   --replace WAS NOW  the line "Requires-Dist: WAS" must exist; it becomes "Requires-Dist: NOW"
#   --add REQ          "Requires-Dist: REQ" is added to the header (must not exist yet)
#   --strip ERE        header lines "Requires-Dist: <name matching ERE>..." are removed
# Exits non-zero with one sentence when the installed metadata is not what the policy expects.
set -euo pipefail
python=$1 site=$2 dist=$3 version=$4
shift 4

norm() { tr 'A-Z' 'a-z' <<<"$1" | sed -E 's/[-_.]+/-/g'; }
want=$(norm "$dist")
info=""
for d in "$site"/*.dist-info; do
  b=$(basename "$d" .dist-info)
  if [ "$(norm "${b%-*}")" = "$want" ] && [ "${b##*-}" = "$version" ]; then info=$d; fi
done
if [ -z "$info" ]; then
  echo "rftstack: no $dist $version dist-info under $site; policy.toml names a version that is not installed" >&2
  exit 1
fi
meta=$info/METADATA
tmp=$(mktemp)
cp "$meta" "$tmp"

while [ $# -gt 0 ]; do
  case $1 in
    --replace)
      was=$2 now=$3; shift 3
      if ! grep -qxF "Requires-Dist: $was" "$tmp"; then
        echo "rftstack: $dist $version does not declare 'Requires-Dist: $was'; policy.toml [[relax]] no longer matches upstream" >&2
        exit 1
      fi
      WAS="Requires-Dist: $was" NOW="Requires-Dist: $now" awk '
        BEGIN { hdr = 1 }
        hdr && $0 == "" { hdr = 0 }
        hdr && $0 == ENVIRON["WAS"] { print ENVIRON["NOW"]; next }
        { print }' "$tmp" > "$tmp.new" && mv "$tmp.new" "$tmp"
      ;;
    --add)
      req=$2; shift 2
      if grep -qxF "Requires-Dist: $req" "$tmp"; then
        echo "rftstack: $dist $version already declares 'Requires-Dist: $req'; drop it from policy.toml [[add]]" >&2
        exit 1
      fi
      # After the last Requires-Dist of the header, or at the end of the header.
      last=$(awk '$0 == "" { exit } /^Requires-Dist: / { n = NR } END { print n + 0 }' "$tmp")
      if [ "$last" -eq 0 ]; then
        last=$(awk '$0 == "" { print NR - 1; f = 1; exit } END { if (!f) print NR }' "$tmp")
      fi
      ADD="Requires-Dist: $req" L=$last awk '{ print } NR == ENVIRON["L"] + 0 { print ENVIRON["ADD"] }' "$tmp" > "$tmp.new" \
        && mv "$tmp.new" "$tmp"
      ;;
    --strip)
      ere=$2; shift 2
      ERE="^Requires-Dist: ($ere)([ ;<>=!~\\[]|\$)" awk '
        BEGIN { hdr = 1 }
        hdr && $0 == "" { hdr = 0 }
        hdr && $0 ~ ENVIRON["ERE"] { next }
        { print }' "$tmp" > "$tmp.new" && mv "$tmp.new" "$tmp"
      ;;
    *)
      echo "rftstack: dist-info-edit.sh: unknown argument '$1'" >&2
      exit 2
      ;;
  esac
done

chmod u+w "$meta" "$info/RECORD" "$info" 2>/dev/null || true
cp "$tmp" "$meta"
rm -f "$tmp"
# RECORD: <path>,sha256=<urlsafe base64, no padding>,<size>
"$python" - "$info" <<'PY'
import base64, hashlib, os, sys
info = sys.argv[1]
rel = os.path.basename(info) + "/METADATA"
data = open(os.path.join(info, "METADATA"), "rb").read()
digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
path = os.path.join(info, "RECORD")
lines = open(path, encoding="utf-8").read().splitlines()
out = [f"{rel},sha256={digest},{len(data)}" if l.split(",", 1)[0] == rel else l for l in lines]
if out == lines and not any(l.split(",", 1)[0] == rel for l in lines):
    sys.exit(f"rftstack: {path} has no line for {rel}")
open(path, "w", encoding="utf-8").write("\n".join(out) + "\n")
PY
