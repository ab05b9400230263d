#!/usr/bin/env bash
# Here (the CPU machine), before a GPU-host session: the things the host lacks, in OUT (default .gpu-extra,
# ignored by git), each small enough to be carried by one device call:
#   go.sh watch.sh stop.sh   the host-side scripts of this folder
#   jre17.tar.xz             a jlink runtime (java.base + java.net.http, ~16 MB) for the java step
#   agent-classes/           examples/java/Agent.java compiled with `javac --release 17`
#   iproute/                 tests/gpu/ip_kit.sh's `ip` (the cluster step), when this machine has `ip`
#   py-spy                   the dev group's py-spy (static), for the profile steps (PY_SPY=/tmp/py-spy)
# The bundle itself: rftstack bundle build --out .wheelhouse --python 3.12 --platform manylinux_2_31_x86_64 \
#   --have tests/gpu/host-packages.txt --exclude-optional-gpu --part-size "$(python3 tests/gpu/device/part_size.py)"
# (a part and the working tree must stay under what one call carries; the tree grows each session, 16 MiB in
# session W, 19.5 MiB in session AF, where the fixed 44 MiB parts of before were refused: part_size.py computes it,
# and this script prints the command with it at the end. .gpu-extra, 25 MiB with py-spy and the jlink runtime,
# travels in a call of its own, the one that runs go.sh.)
# Rebuild it after any change to rftstack (seconds from uv's cache): the bundle carries the rftstack wheel of the tree
# it was built from, and install.py applies that wheel's patches; go.sh refuses a bundle whose rftstack package (code,
# policy) or patches are not the carried tree's (same_tree.py; session O ran an older one before this check).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../../.." && pwd)
out=${1:-$repo/.gpu-extra}
mkdir -p "$out"
cp "$here/go.sh" "$here/watch.sh" "$here/stop.sh" "$out/"
if command -v jlink >/dev/null && command -v javac >/dev/null; then
    tmp=$(mktemp -d)
    jlink --add-modules java.base,java.net.http --output "$tmp/jre17" --strip-debug --no-header-files --no-man-pages --compress=2
    tar cJf "$out/jre17.tar.xz" -C "$tmp" jre17 && rm -rf "$tmp"
    rm -rf "$out/agent-classes" && javac --release 17 -d "$out/agent-classes" "$repo/examples/java/Agent.java"
else
    echo "kit.sh: no jlink/javac here: the java step will skip on the host" >&2
fi
# py-spy for the profile steps (PY_SPY=/tmp/py-spy): the dev group's static binary
if [ -x "$repo/.venv/bin/py-spy" ]; then cp "$repo/.venv/bin/py-spy" "$out/py-spy"; fi
if command -v ip >/dev/null; then bash "$repo/tests/gpu/ip_kit.sh" "$out/iproute" >/dev/null; fi
ls -la "$out"
# part_size.py's own sentence (a tree too large, not a checkout) ends this script with its exit status
size=$(python3 "$here/part_size.py" "$repo") || exit $?
echo "the bundle (parts sized for this tree): rftstack bundle build --out .wheelhouse --python 3.12" \
    "--platform manylinux_2_31_x86_64 --have tests/gpu/host-packages.txt --exclude-optional-gpu --part-size $size"
