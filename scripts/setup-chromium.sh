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
# shellcheck source=lib/apt.sh
source "$ROOT/scripts/lib/apt.sh"

say() { printf 'setup-chromium: %s\n' "$*"; }

have() { command -v "$1" >/dev/null 2>&1; }

if have chromium; then
  say "already installed: $(chromium --version 2>/dev/null | head -n1)"
  exit 0
fi

apt_install setup-chromium chromium fonts-dejavu-core
say "installed: $(chromium --version 2>/dev/null | head -n1)"
