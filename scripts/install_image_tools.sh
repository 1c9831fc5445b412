#!/bin/sh
# Install what building and running the container image without a registry needs:
# buildah (builds the Dockerfile), mmdebstrap (makes a Debian bookworm base image from
# Debian's packages) and runc (the OCI runtime `buildah run --isolation oci` runs the image
# with: a PID namespace of its own, where tini is PID 1; crun refuses this machine's hybrid
# cgroups). Idempotent: installs only what is missing, and refreshes apt's package lists
# only when a package cannot be found in them. Run as root (CI is); tox -e image runs it.
set -eu

missing=""
command -v buildah >/dev/null 2>&1 || missing="$missing buildah"
command -v mmdebstrap >/dev/null 2>&1 || missing="$missing mmdebstrap"
[ -x /usr/bin/runc ] || missing="$missing runc"
[ -z "$missing" ] && exit 0

# shellcheck disable=SC2086
sh "$(dirname "$0")/apt_install.sh" "the image tests" $missing
