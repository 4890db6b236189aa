#!/usr/bin/env bash
# Install every tool tests/tools drives (make test-tools; make test runs this in
# setup-system, before pytest), then look for each the way the tests do. Under CI (CI set)
# a missing tool fails its test, so a fresh machine must have them all before pytest.
#
#   scripts/setup-tools.sh
#
#   promtool, amtool, Alertmanager   scripts/setup-prometheus.sh (Debian's prometheus,
#                                    prometheus-alertmanager)
#   a Docker Compose CLI             scripts/setup-docker.sh (Debian's docker-compose 1.29,
#                                    with docker.io and mmdebstrap, which make test-docker
#                                    uses next: one home for that install)
#   chromium                         scripts/setup-chromium.sh
#   systemd-analyze                  Debian's systemd, here
#   check-jsonschema, hadolint       the venv's [test] extra (make setup): looked for, not
#                                    installed here
#
# Idempotent: each step does nothing when its tools are there (under a second in all).
# Installed packages are the machine's own (apt), so a fresh clone on a machine that ran
# this once installs nothing. apt's output goes to .cache/setup-apt.log. Uses sudo when
# not root. Exits 1 naming what is still missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/apt.sh
source "$ROOT/scripts/lib/apt.sh"

VENV_BIN="$ROOT/.venv/bin"

say() { printf 'setup-tools: %s\n' "$*"; }
die() { printf 'setup-tools: ERROR: %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

bash "$ROOT/scripts/setup-prometheus.sh"
bash "$ROOT/scripts/setup-docker.sh"
bash "$ROOT/scripts/setup-chromium.sh"
if ! have systemd-analyze; then
  apt_install setup-tools systemd
fi

# The tests' own lookups: tests/observability.py (PATH), tests/tools/test_deploy_tools.py
# (the venv, then PATH), tests/deploy.py's compose_binary ($DOCKER_COMPOSE, `docker
# compose`, docker-compose).
compose_cli() {
  if [[ -n "${DOCKER_COMPOSE:-}" ]]; then
    # shellcheck disable=SC2086 # a command line, as tests/deploy.py splits it
    $DOCKER_COMPOSE version --short >/dev/null 2>&1
    return
  fi
  { have docker && docker compose version --short >/dev/null 2>&1; } \
    || { have docker-compose && docker-compose version --short >/dev/null 2>&1; }
}
venv_or_path() { [[ -x "$VENV_BIN/$1" ]] || have "$1"; }

missing=()
for bin in promtool amtool systemd-analyze chromium; do
  have "$bin" || missing+=("$bin")
done
have prometheus-alertmanager || have alertmanager || missing+=(prometheus-alertmanager)
compose_cli || missing+=("a Docker Compose CLI")
for bin in check-jsonschema hadolint; do
  venv_or_path "$bin" || missing+=("$bin (in $VENV_BIN: make setup)")
done
((${#missing[@]} == 0)) || die "still missing: $(IFS=,; echo "${missing[*]}" | sed 's/,/, /g')"
say "ready: every tool tests/tools drives"
