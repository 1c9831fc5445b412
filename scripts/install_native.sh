#!/bin/sh
# Install what the native runtime's tests need (tox -e native): a C compiler and the C
# library's headers (gcc, libc6-dev), from Debian's packages; the tests build shared
# libraries with them. Idempotent: installs only what is missing, and refreshes apt's
# package lists only when a package cannot be found in them. Run as root (CI is).
set -eu

missing=""
command -v gcc >/dev/null 2>&1 || missing="$missing gcc"
[ -f /usr/include/stdio.h ] || missing="$missing libc6-dev"
[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "the native runtime's tests need:$missing; run 'apt-get install$missing' as root" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Another apt run (a peer's install script) may hold the lock: wait for it, bounded.
apt_get() { apt-get -o DPkg::Lock::Timeout=300 "$@"; }
# shellcheck disable=SC2086
if ! apt_get install -y --no-install-recommends $missing; then
    apt_get update -qq
    # shellcheck disable=SC2086
    apt_get install -y --no-install-recommends $missing
fi
