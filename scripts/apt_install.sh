#!/bin/sh
# Install Debian packages for a test environment: `sh scripts/apt_install.sh WHO PACKAGE...`
# (WHO names what needs them, for the message a non-root user gets). Refreshes apt's
# package lists only when a package cannot be found in them, and waits (bounded) for
# another apt run holding the lock. Used by the scripts/install_*.sh that know what is
# missing; run as root (CI is).
set -eu

who=$1
shift
if [ "$(id -u)" != 0 ]; then
    echo "$who need: $*; run 'apt-get install $*' as root" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Another apt run (a peer's install script) may hold the lock: wait for it, bounded.
apt_get() { apt-get -o DPkg::Lock::Timeout=300 "$@"; }
if ! apt_get install -y --no-install-recommends "$@"; then
    apt_get update -qq
    apt_get install -y --no-install-recommends "$@"
fi
