#!/usr/bin/env bash
# Install what tests/docker/ (make test-docker) needs from Debian's own packages: the
# Docker engine and CLI (docker.io, dockerd 20.10), docker-compose 1.29 (Compose v1, what
# Debian 12 ships), and mmdebstrap (builds the stand-in base images, scripts/docker-standins.sh).
#
#   scripts/setup-docker.sh
#
# Idempotent: does nothing when dockerd, Debian's docker CLI, docker-compose and mmdebstrap
# are there. apt's, dpkg's and needrestart's output goes to a log file, not the terminal.
# Uses sudo when not root. Starting the engine is scripts/test-docker.sh's job.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOG="$ROOT/.cache/setup-apt.log"
# shellcheck source=lib/apt.sh
source "$ROOT/scripts/lib/apt.sh"

say() { printf 'setup-docker: %s\n' "$*"; }
die() { printf 'setup-docker: ERROR: %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

missing=()
{ have dockerd && [[ -x /usr/bin/docker ]]; } || missing+=(docker.io)
have docker-compose || missing+=(docker-compose)
have mmdebstrap || missing+=(mmdebstrap)

if ((${#missing[@]} == 0)); then
  say "already installed: $(dockerd --version 2>/dev/null), $(docker-compose version --short 2>/dev/null | head -n1)"
  exit 0
fi

apt_install setup-docker "${missing[@]}"

for bin in dockerd docker-compose mmdebstrap; do
  have "$bin" || die "$bin still missing after apt-get install (log: $LOG)"
done
say "installed: $(dockerd --version), docker-compose $(docker-compose version --short | head -n1)"
