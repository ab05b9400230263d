#!/usr/bin/env bash
# Find the host's NVIDIA driver libraries (libcuda.so.1 and its libnvidia-* companions) at run
# time, without baking a driver into the Nix closure. Sourced by the flake's wrappers (nix/wrap.nix)
# and run directly by nix/ci-check.sh against a fake host tree.
#
#   rftstack_driver_dir   prints a directory holding ONLY driver libraries, for LD_LIBRARY_PATH:
#     1. $RFTSTACK_DRIVER_DIR if set (the user's explicit choice; used as is)
#     2. /run/opengl-driver/lib (NixOS: hardware.graphics puts only driver libs there)
#     3. the directory of libcuda.so.1 from `ldconfig -p`, else from known paths (Ubuntu/Debian
#        /usr/lib/x86_64-linux-gnu, RHEL /usr/lib64, containers /usr/local/nvidia/lib64, WSL).
#        Such a directory also holds the host's libc & co, which must not shadow the closure's, so
#        the driver libraries are symlinked into a private cache directory and that is printed.
#   Prints nothing and returns 1 when no libcuda.so.1 is found (no GPU driver: doctor says so).
#
# Test seams: RFTSTACK_HOST_ROOT prefixes every fixed path; RFTSTACK_LDCONFIG replaces `ldconfig -p`.

rftstack__driver_libs_pattern='^(libcuda\.so|libcudadebugger\.so|libnvidia-[a-z0-9_-]+\.so|libnvcuvid\.so)'

rftstack__find_libcuda_dir() {
  local root=${RFTSTACK_HOST_ROOT:-} line path d
  if [ -e "$root/run/opengl-driver/lib/libcuda.so.1" ]; then
    echo "nixos:$root/run/opengl-driver/lib"; return 0
  fi
  if [ -n "${RFTSTACK_LDCONFIG:-}" ]; then
    line=$($RFTSTACK_LDCONFIG 2>/dev/null | grep -E '^\s*libcuda\.so\.1 \(.*x86-64' | head -n1)
  else
    line=$( { /sbin/ldconfig -p || ldconfig -p; } 2>/dev/null | grep -E '^\s*libcuda\.so\.1 \(.*x86-64' | head -n1)
  fi
  path=${line##*=> }
  if [ -n "$line" ] && [ -e "$root$path" ]; then
    echo "host:$(dirname "$root$path")"; return 0
  fi
  for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 /usr/lib/wsl/lib /usr/lib; do
    if [ -e "$root$d/libcuda.so.1" ]; then echo "host:$root$d"; return 0; fi
  done
  return 1
}

rftstack_driver_dir() {
  if [ -n "${RFTSTACK_DRIVER_DIR:-}" ]; then echo "$RFTSTACK_DRIVER_DIR"; return 0; fi
  local found kind dir cache f name
  found=$(rftstack__find_libcuda_dir) || return 1
  kind=${found%%:*} dir=${found#*:}
  if [ "$kind" = nixos ]; then echo "$dir"; return 0; fi
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/rftstack/driver-libs/$(printf '%s' "$dir" | cksum | cut -d' ' -f1)
  mkdir -p "$cache"
  find "$cache" -maxdepth 1 -type l -delete
  for f in "$dir"/*; do
    name=${f##*/}
    if [[ $name =~ $rftstack__driver_libs_pattern ]]; then ln -sfn "$f" "$cache/$name"; fi
  done
  echo "$cache"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  rftstack_driver_dir
fi
