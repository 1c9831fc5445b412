#!/bin/sh
# apt_install.sh WHO PACKAGE...: install Debian's PACKAGEs for WHO (what needs them, for the
# message), as root (CI is), the install_*.sh scripts' common part. Waits (bounded) for
# another apt run (a peer's install script) to free the lock, and refreshes apt's package
# lists only when a package cannot be found in them.
set -eu

who=$1
shift
if [ "$(id -u)" != 0 ]; then
    echo "$who need:$(printf ' %s' "$@"); run 'apt-get install$(printf ' %s' "$@")' as root" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt_get() { apt-get -o DPkg::Lock::Timeout=300 "$@"; }
if ! apt_get install -y --no-install-recommends "$@"; then
    apt_get update -qq
    apt_get install -y --no-install-recommends "$@"
fi
