#!/bin/sh
# Install Prometheus and promtool from Debian's `prometheus` package, for the tests that use
# them: tests/e2e/test_prometheus.py (tox -e slow: a real Prometheus scraping live servers
# with deploy/prometheus/alerts.yml) and tests/deploy/test_monitoring.py (tox -e deploy:
# promtool check rules / check config / test rules). Both skip, saying why, when the
# binaries are missing. Idempotent: installs only when one is missing, and refreshes apt's
# package lists only when the package cannot be found in them. Run as root (CI is);
# .ci/run runs it before the slow and deploy environments.
set -eu

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi
sh "$(dirname "$0")/apt_install.sh" "the Prometheus tests" prometheus
prometheus --version >/dev/null 2>&1 && promtool --version >/dev/null 2>&1
