#!/bin/sh
# Make a Debian bookworm base image without a container registry, for building the
# Dockerfile with --build-arg BASE=... where the official python:3.11-slim cannot be pulled.
#
#   scripts/build_image_base.sh [CACHE_DIR]     (CACHE_DIR defaults to build/image)
#
# mmdebstrap writes the root file system from Debian's packages into a tar; buildah imports
# it (FROM scratch + ADD) as localhost/inferpool-base:<key>. The key is a hash of this
# script, so the tar and the image are made again only when the recipe changes; a second run
# prints the same name at once. Prints the image name (the last line) for --build-arg BASE.
#
# The base holds Python 3.11 (bookworm's python3, at /usr/bin/python3), venv and the CA
# certificates, and on purpose no compiler and no tini: the Dockerfile installs what is
# missing with apt, as it must on the official slim image, so that path is the one tested
# and the final image can be checked to hold no compiler.
set -eu

CACHE=${1:-build/image}
PACKAGES=python3,python3-venv,ca-certificates
key=$(sha256sum "$0" | cut -c1-12)
name=localhost/inferpool-base:$key
storage="--storage-driver vfs"

# shellcheck disable=SC2086
if buildah $storage inspect --type image "$name" >/dev/null 2>&1; then
    echo "$name"
    exit 0
fi
mkdir -p "$CACHE"
tar="$CACHE/base-$key.tar"
if [ ! -s "$tar" ]; then
    rm -rf "$CACHE"/base-*.tar*
    mmdebstrap --quiet --format=tar --variant=apt --include="$PACKAGES" bookworm "$tar.part" >&2
    mv "$tar.part" "$tar"
fi
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
ln "$tar" "$context/base.tar" 2>/dev/null || cp "$tar" "$context/base.tar"
printf 'FROM scratch\nADD base.tar /\nCMD ["/bin/bash"]\n' >"$context/Containerfile"
# shellcheck disable=SC2086
buildah $storage bud --quiet --isolation chroot -f "$context/Containerfile" -t "$name" \
    "$context" >&2
echo "$name"
