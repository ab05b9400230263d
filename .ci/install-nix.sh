#!/usr/bin/env bash
# Install Nix 2.26 (Debian trixie's nix-bin) into a private prefix on Debian 12 (bookworm), for the
# flake's evaluation checks (nix/ci-check.sh, tests/stack/test_nix.py). Nothing of the base system changes:
#   - nix-bin and its library closure are downloaded from Debian's archive with a private apt
#     configuration and unpacked with dpkg-deb -x (no dpkg database, no install scripts);
#   - trixie's libc comes with them; the nix binary is pointed at that ld.so with trixie's own
#     patchelf, run through the same ld.so, so no patchelf of the host is needed;
#   - the Nix configuration is written under the prefix (NIX_CONF_DIR), not to /etc/nix.
# Needs: bash, apt-get, dpkg-deb, Debian's archive (deb.debian.org or NIX_DEBIAN_MIRROR).
# Root: /nix/store is created when it can be; otherwise the store lives under the prefix
# (a chroot store: evaluation works, built paths are not runnable from outside).
#
# Usage: eval "$(bash .ci/install-nix.sh | grep '^export ')"
#   NIX_PREFIX   where to install (default ${XDG_CACHE_HOME:-~/.cache}/rftstack/nix-trixie)
# The last lines on stdout are `export PATH=...` and `export NIX_CONF_DIR=...`.
# A prefix that already holds a working nix is reused (no download).
set -euo pipefail
suite=trixie                                   # nix-bin 2.26.3 (the version the checks are run with)
want_version=2.26
mirror=${NIX_DEBIAN_MIRROR:-http://deb.debian.org/debian}
prefix=${NIX_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/rftstack/nix-$suite}
libdir=$prefix/usr/lib/x86_64-linux-gnu
confdir=$prefix/etc/nix

say_exports() {
  echo "export PATH=$prefix/usr/bin:\$PATH"
  echo "export NIX_CONF_DIR=$confdir"
}

if [ -x "$prefix/usr/bin/nix" ] && [ -f "$confdir/nix.conf" ] \
   && NIX_CONF_DIR=$confdir "$prefix/usr/bin/nix" --version 2>/dev/null | grep -q " $want_version\."; then
  echo "Nix already installed in $prefix" >&2
  say_exports
  exit 0
fi

mkdir -p "$prefix" 2>/dev/null && [ -w "$prefix" ] || { echo "install-nix: cannot create or write $prefix; set NIX_PREFIX to a writable folder." >&2; exit 1; }
for tool in apt-get apt-cache dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "install-nix: $tool is missing; this script needs a Debian-based machine (Debian 12 is what CI runs)." >&2; exit 1; }
done
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || { echo "install-nix: $keyring is missing; install the debian-archive-keyring package first." >&2; exit 1; }

apt_dir=$(mktemp -d "${TMPDIR:-/tmp}/rftstack-nix-apt.XXXXXX")
trap 'rm -rf "$apt_dir"' EXIT
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs"
echo "deb [signed-by=$keyring] $mirror $suite main" > "$apt_dir/sources.list"
cat > "$apt_dir/apt.conf" <<CONF
Dir::Etc::SourceList "$apt_dir/sources.list";
Dir::Etc::SourceParts "/dev/null";
Dir::Etc::Preferences "/dev/null";
Dir::Etc::PreferencesParts "/dev/null";
Dir::State::Lists "$apt_dir/lists";
Dir::Cache "$apt_dir/cache";
Dir::State::status "$apt_dir/status";
Debug::NoLocking "true";
APT::Sandbox::User "$(id -un)";
APT::Architecture "amd64";
CONF
: > "$apt_dir/status"
apt() { APT_CONFIG="$apt_dir/apt.conf" "$@"; }

apt apt-get -qq update
# nix-bin's run-time closure (libraries only: no perl, PAM, debconf pieces), plus patchelf.
apt apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances nix-bin patchelf 2>/dev/null \
  | grep -v '^[ <]' | sort -u \
  | grep -E '^(lib|zlib1g$|nix-bin$|bash-static$|patchelf$)' \
  | grep -vE 'perl|^libpam|^libsemanage|^libdebian-installer|^libdebconfclient|^libnewt|^libslang|^libtextwrap|^libaudit|^libcap-ng|^libgdbm|^libdb5' \
  > "$apt_dir/pkgs"
grep -qx nix-bin "$apt_dir/pkgs" || { echo "install-nix: $mirror $suite has no nix-bin package." >&2; exit 1; }
(cd "$apt_dir/debs" && apt apt-get -qq download $(cat "$apt_dir/pkgs") 2>&1 | grep -v 'unsandboxed' >&2 || true)
[ -n "$(ls "$apt_dir/debs")" ] || { echo "install-nix: downloading from $mirror failed." >&2; exit 1; }

rm -rf "$prefix"; mkdir -p "$prefix"
for deb in "$apt_dir"/debs/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
ld_so=$libdir/ld-linux-x86-64.so.2
"$ld_so" --library-path "$libdir" "$prefix/usr/bin/patchelf" \
  --set-interpreter "$ld_so" --force-rpath --set-rpath "$libdir" "$prefix/usr/bin/nix"

mkdir -p "$confdir"
store_line=""
if ! mkdir -p /nix/store 2>/dev/null || [ ! -w /nix/store ]; then
  store_line="store = local?root=$prefix/root"
fi
cat > "$confdir/nix.conf" <<CONF
build-users-group =
experimental-features = nix-command flakes
substituters =
sandbox = false
sandbox-paths = /bin/sh=$prefix/usr/bin/bash-static
$store_line
CONF

version=$(NIX_CONF_DIR=$confdir "$prefix/usr/bin/nix" --version)
case "$version" in
  *" $want_version."*) echo "$version installed in $prefix" >&2 ;;
  *) echo "install-nix: expected Nix $want_version, got '$version' from $suite." >&2; exit 1 ;;
esac
say_exports
