#!/usr/bin/env bash
# Install the real Prometheus (with promtool) and Alertmanager (with amtool) from Debian,
# for tests/unit/test_observability_static.py and tests/integration/test_alerting_e2e.py.
#
#   scripts/setup-prometheus.sh
#
# Idempotent: when prometheus, promtool, prometheus-alertmanager (or alertmanager) and
# amtool are all on PATH it does nothing. Otherwise one `apt-get update`, then
# `apt-get install --no-install-recommends prometheus prometheus-alertmanager` (about
# 10 s; no node-exporter, which is only a recommendation); apt's output goes to
# .cache/setup-apt.log. Uses sudo when not root.
#
# Debian's packages also install systemd units that start a Prometheus on :9090 and an
# Alertmanager on :9093 where systemd runs; the tests never use those ports (they pick
# free ones), so a running service does not disturb them.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/apt.sh
source "$ROOT/scripts/lib/apt.sh"

say() { printf 'setup-prometheus: %s\n' "$*"; }

have() { command -v "$1" >/dev/null 2>&1; }

missing=()
have prometheus && have promtool || missing+=(prometheus)
{ have prometheus-alertmanager || have alertmanager; } && have amtool \
  || missing+=(prometheus-alertmanager)

if ((${#missing[@]} == 0)); then
  say "already installed: $(prometheus --version 2>&1 | head -n1)"
  exit 0
fi

apt_install setup-prometheus "${missing[@]}"

for bin in prometheus promtool amtool; do
  have "$bin" || { say "ERROR: $bin still missing after apt-get install" >&2; exit 1; }
done
say "installed: $(prometheus --version 2>&1 | head -n1)"
