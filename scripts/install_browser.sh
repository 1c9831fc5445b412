#!/bin/sh
# Install what tox -e browser needs: Debian's Chromium and its chromedriver, which selenium
# drives from /usr/bin/chromedriver (tests/browser; selenium's own manager, which would
# download a browser, is never used). Idempotent: installs only what is missing
# (scripts/apt_install.sh). Run as root (CI is); .ci/run runs it before tox.
set -eu

missing=""
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
[ -x /usr/bin/chromedriver ] || missing="$missing chromium-driver"
[ -z "$missing" ] && exit 0
# shellcheck disable=SC2086
exec sh "$(dirname "$0")/apt_install.sh" "the browser tests" $missing
