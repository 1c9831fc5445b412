#!/bin/sh
# Install what tox -e browser needs: Debian's Chromium and its chromedriver, which selenium
# drives from /usr/bin/chromedriver (tests/browser; selenium's own manager, which would
# download a browser, is never used). Idempotent: installs only what is missing, and
# refreshes apt's package lists only when a package cannot be found in them. Run as root
# (CI is).
set -eu

missing=""
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
[ -x /usr/bin/chromedriver ] || missing="$missing chromium-driver"
[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "the browser tests need:$missing; run 'apt-get install$missing' as root" >&2
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
