#!/bin/sh
# Install Java for the java and pmml runtimes' tests (tox -e languages): Debian's JDK 17,
# headless (javac and jar: the tests compile their models; java: JPype's JVM and
# sklearn2pmml's converter). Idempotent: installs only when javac is missing, and
# refreshes apt's package lists only when the package cannot be found in them. Run as
# root (CI is); tox -e languages runs it.
set -eu

command -v javac >/dev/null 2>&1 && exit 0

sh "$(dirname "$0")/apt_install.sh" "the java tests" default-jdk-headless
