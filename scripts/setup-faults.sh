#!/usr/bin/env bash
# Install what the fault suite (tests/faults/, docs/faults.md) drives for real: libfaketime
# from Debian (the wall clock stepped under a soakd process, NTP-style), and the tools the
# disk faults mount filesystems with (mount, mkfs.ext4: util-linux and e2fsprogs, normally
# present).
#
#   scripts/setup-faults.sh
#
# Idempotent: does nothing when libfaketime is there. Uses sudo when not root.
set -euo pipefail

say() { printf 'setup-faults: %s\n' "$*"; }

have_faketime() {
  ls /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1 >/dev/null 2>&1
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

say "installing ${missing[*]}"
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
