#!/usr/bin/env bash
# A kit of iproute2's `ip` for a GPU host that has none (tests/gpu/test_cluster_gpu.py needs `ip netns`):
#
#   bash tests/gpu/ip_kit.sh OUT      # here, on a Linux x86-64 machine that has `ip`
#
# OUT gets ip.bin (this machine's `ip`), lib/ (the libraries it links, except glibc's own libc and
# loader, which the host provides) and `ip`, a wrapper that runs ip.bin through the host's dynamic
# loader with --library-path: only ip.bin sees lib/, so nothing `ip netns exec` starts inherits a
# library path. Carry OUT to the host and put it first on PATH (the host's glibc must be as new as
# this machine's). docs/gpu-results.md, session G, shows it in use.
set -euo pipefail
out=${1:?usage: ip_kit.sh OUT}
src=$(command -v ip) || { echo "ip_kit.sh: there is no \`ip\` on this machine's PATH; install iproute2 here (apt-get install iproute2) and run it again" >&2; exit 2; }
mkdir -p "$out/lib"
cp -L "$src" "$out/ip.bin"
ldd "$src" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    case $(basename "$lib") in
        libc.so.*|ld-linux*) ;;
        *) cp -L "$lib" "$out/lib/" ;;
    esac
done
cat > "$out/ip" <<'WRAPPER'
#!/bin/sh
# iproute2's `ip` with its own libraries (made by tests/gpu/ip_kit.sh)
d=$(dirname "$(readlink -f "$0")")
exec /lib64/ld-linux-x86-64.so.2 --library-path "$d/lib" "$d/ip.bin" "$@"
WRAPPER
chmod +x "$out/ip"
"$out/ip" -V
