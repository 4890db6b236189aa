#!/usr/bin/env bash
# Install what the fault suite (tests/faults/, docs/faults.md) drives for real: libfaketime
# from Debian (the wall clock stepped under a soakd process, NTP-style), and the tools the
# disk faults mount filesystems with (mount, mkfs.ext4: util-linux and e2fsprogs, normally
# present).
#
#   scripts/setup-faults.sh
#
# Idempotent: does nothing when libfaketime is there. apt's output goes to
# .cache/setup-apt.log. Uses sudo when not root.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/apt.sh
source "$ROOT/scripts/lib/apt.sh"

say() { printf 'setup-faults: %s\n' "$*"; }

# Debian puts it under the multiarch directory (/usr/lib/x86_64-linux-gnu/faketime/), other
# builds under /usr/lib/faketime/: either one will do.
have_faketime() {
  local lib
  for lib in /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1; do
    [[ -e "$lib" ]] && return 0
  done
  return 1
}

missing=()
have_faketime || missing+=(libfaketime)
command -v mkfs.ext4 >/dev/null 2>&1 || missing+=(e2fsprogs)

if ((${#missing[@]} == 0)); then
  say "already installed"
  exit 0
fi

apt_install setup-faults "${missing[@]}"
