#!/bin/sh
# Install Java for the java and pmml runtimes' tests (tox -e languages): Debian's JDK 17,
# headless (javac and jar: the tests compile their models; java: JPype's JVM and
# sklearn2pmml's converter). Idempotent: installs only when javac is missing, and
# refreshes apt's package lists only when the package cannot be found in them. Run as
# root (CI is); tox -e languages runs it.
set -eu

command -v javac >/dev/null 2>&1 && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "the java tests need a JDK; run 'apt-get install default-jdk-headless' as root" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Another apt run (a peer's install script) may hold the lock: wait for it, bounded.
apt_get() { apt-get -o DPkg::Lock::Timeout=300 "$@"; }
if ! apt_get install -y --no-install-recommends default-jdk-headless; then
    apt_get update -qq
    apt_get install -y --no-install-recommends default-jdk-headless
fi
