#!/bin/sh
# Install what the R runtime's tests need (tox -e languages): R (r-base-core: libR, Rscript and the
# headers rpy2 builds against) and the randomForest package, from Debian's packages.
# Idempotent: installs only what is missing (scripts/apt_install.sh). Run as root (CI
# is): .ci/run calls it before tox, since rpy2 is built against R when tox fills tox -e languages.
set -eu

missing=""
command -v Rscript >/dev/null 2>&1 || missing="$missing r-base-core"
if ! Rscript -e 'quit(status = !requireNamespace("randomForest", quietly = TRUE))' \
    >/dev/null 2>&1; then
    missing="$missing r-cran-randomforest"
fi
[ -z "$missing" ] && exit 0

# shellcheck disable=SC2086
sh "$(dirname "$0")/apt_install.sh" "the R runtime's tests" $missing
