#!/bin/sh
# Install what the R runtime's tests need (tox -e r): R (r-base-core: libR, Rscript and the
# headers rpy2 builds against) and the randomForest package, from Debian's packages.
# Idempotent: installs only what is missing, and refreshes apt's package lists only when a
# package cannot be found in them. Run as root (CI is): .ci/run calls it before tox, since
# rpy2 is built against R when tox fills the environment.
set -eu

missing=""
command -v Rscript >/dev/null 2>&1 || missing="$missing r-base-core"
if ! Rscript -e 'quit(status = !requireNamespace("randomForest", quietly = TRUE))' \
    >/dev/null 2>&1; then
    missing="$missing r-cran-randomforest"
fi
[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "the R runtime's tests need:$missing; run 'apt-get install$missing' as root" >&2
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
