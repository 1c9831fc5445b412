#!/bin/sh
# Install what the native runtime's tests need (tox -e languages): a C compiler and the C
# library's headers (gcc, libc6-dev), from Debian's packages; the tests build shared
# libraries with them. Idempotent: installs only what is missing, and refreshes apt's
# package lists only when a package cannot be found in them. Run as root (CI is).
set -eu

missing=""
command -v gcc >/dev/null 2>&1 || missing="$missing gcc"
[ -f /usr/include/stdio.h ] || missing="$missing libc6-dev"
[ -z "$missing" ] && exit 0

# shellcheck disable=SC2086
sh "$(dirname "$0")/apt_install.sh" "the native runtime's tests" $missing
