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
LOG="$ROOT/.cache/setup-apt.log"

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

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null 2>&1 || { say "ERROR: not root and no sudo; install ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi

say "installing ${missing[*]} (log: $LOG)"
mkdir -p "$(dirname "$LOG")"
{ "${SUDO[@]}" apt-get update -q \
    && "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=a NEEDRESTART_SUSPEND=1 \
      apt-get install -y -q -o DPkg::Lock::Timeout=900 --no-install-recommends "${missing[@]}"; } >>"$LOG" 2>&1 \
  || { tail -n 20 "$LOG" >&2; say "ERROR: apt-get install ${missing[@]} failed (full log: $LOG)" >&2; exit 1; }
