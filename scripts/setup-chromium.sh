#!/usr/bin/env bash
# Install Debian's chromium for tests/unit/test_report.py, which opens the HTML report in a
# real headless browser and takes a screenshot.
#
#   scripts/setup-chromium.sh
#
# Idempotent: when `chromium` is on PATH it does nothing. Otherwise one `apt-get update`,
# then `apt-get install --no-install-recommends chromium` (Debian's own build; no browser
# download from anywhere else); apt's output goes to .cache/setup-apt.log. Uses sudo when
# not root.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOG="$ROOT/.cache/setup-apt.log"

say() { printf 'setup-chromium: %s\n' "$*"; }

have() { command -v "$1" >/dev/null 2>&1; }

if have chromium; then
  say "already installed: $(chromium --version 2>/dev/null | head -n1)"
  exit 0
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  have sudo || { say "ERROR: not root and no sudo; install chromium by hand" >&2; exit 1; }
  SUDO=(sudo)
fi

say "installing chromium (log: $LOG)"
mkdir -p "$(dirname "$LOG")"
{ "${SUDO[@]}" apt-get update -q \
    && "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=a NEEDRESTART_SUSPEND=1 \
      apt-get install -y -q -o DPkg::Lock::Timeout=900 --no-install-recommends chromium fonts-dejavu-core; } >>"$LOG" 2>&1 \
  || { tail -n 20 "$LOG" >&2; say "ERROR: apt-get install chromium fonts-dejavu-core failed (full log: $LOG)" >&2; exit 1; }
say "installed: $(chromium --version 2>/dev/null | head -n1)"
