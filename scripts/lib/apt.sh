# Sourced by the setup scripts: one way to install Debian packages.
#
#   source "$ROOT/scripts/lib/apt.sh"
#   apt_install NAME PKG...   # NAME prefixes the messages (e.g. setup-docker)
#
# One `apt-get update`, then `apt-get install --no-install-recommends PKG...` without
# prompts (needrestart quiet, dpkg's lock waited for up to 15 min). apt's and dpkg's output
# goes to $ROOT/.cache/setup-apt.log; on failure its last 20 lines are shown and the script
# exits 1. Uses sudo when not root. $ROOT must be the project root.

apt_install() {
  local name=$1
  shift
  local log="$ROOT/.cache/setup-apt.log"
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
      printf '%s: ERROR: not root and no sudo; install %s by hand\n' "$name" "$*" >&2
      exit 1
    fi
    sudo=(sudo)
  fi
  mkdir -p "$(dirname "$log")"
  printf '%s: installing %s (log: %s)\n' "$name" "$*" "$log"
  { "${sudo[@]}" apt-get update -q \
      && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=a NEEDRESTART_SUSPEND=1 \
        apt-get install -y -q -o DPkg::Lock::Timeout=900 --no-install-recommends "$@"; } >>"$log" 2>&1 \
    || {
      tail -n 20 "$log" >&2
      printf '%s: ERROR: apt-get install %s failed (full log: %s)\n' "$name" "$*" "$log" >&2
      exit 1
    }
}
