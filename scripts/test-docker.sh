#!/usr/bin/env bash
# make test-docker: the `sim` compose stack on a real Docker engine (tests/docker/).
#
#   scripts/test-docker.sh [pytest args...]
#
#   1. scripts/setup-docker.sh: Debian's docker.io, docker-compose (1.29) and mmdebstrap
#      when missing (apt's output to .cache/setup-apt.log)
#   2. a Docker engine: the one that answers `docker info`, else a dockerd started here
#      (log: .cache/docker/dockerd.log) and stopped again at the end, pass or fail
#   3. scripts/docker-standins.sh: the stand-in base, Prometheus and Alertmanager images
#      (cached under /var/cache/soakd/docker)
#   4. pytest -m docker tests/docker: builds the soakd image, brings the stack up,
#      asserts, and tears it down (`down -v`); the stand-in images stay
#
# Needs root (or sudo for apt and dockerd). An engine that cannot start is an error with
# dockerd's last log lines, never a skip.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOGDIR="$ROOT/.cache/docker"
PYTEST="${PYTEST:-$ROOT/.venv/bin/pytest}"

say() { printf 'test-docker: %s\n' "$*"; }
die() { printf 'test-docker: ERROR: %s\n' "$*" >&2; exit 1; }

mkdir -p "$LOGDIR"
T0=$SECONDS
bash "$ROOT/scripts/setup-docker.sh"

# Debian's CLI (20.10) builds with BuildKit by itself (DOCKER_BUILDKIT=1). A newer CLI
# earlier on PATH (23+) needs the buildx plugin for that, and --secret with it.
if [[ -z "${DOCKER:-}" ]]; then
  if [[ -x /usr/bin/docker ]]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi
export DOCKER DOCKER_BUILDKIT=1

DOCKERD_PID=""
stop_dockerd() {
  [[ -n "$DOCKERD_PID" ]] || return 0
  say "stopping the dockerd started here (pid $DOCKERD_PID)"
  kill -TERM "$DOCKERD_PID" 2>/dev/null || return 0
  for _ in $(seq 1 60); do
    kill -0 "$DOCKERD_PID" 2>/dev/null || return 0
    sleep 0.5
  done
  say "dockerd (pid $DOCKERD_PID) did not stop within 30 s; killing it"
  kill -KILL "$DOCKERD_PID" 2>/dev/null || true
}
trap stop_dockerd EXIT

if "$DOCKER" info >/dev/null 2>&1; then
  say "using the running Docker engine ($("$DOCKER" version -f '{{.Server.Version}}' 2>/dev/null))"
else
  SUDO=()
  [[ $(id -u) -eq 0 ]] || SUDO=(sudo)
  say "starting dockerd (log: $LOGDIR/dockerd.log)"
  "${SUDO[@]}" setsid dockerd >"$LOGDIR/dockerd.log" 2>&1 </dev/null &
  DOCKERD_PID=$!
  for _ in $(seq 1 120); do
    "$DOCKER" info >/dev/null 2>&1 && break
    kill -0 "$DOCKERD_PID" 2>/dev/null || {
      tail -n 20 "$LOGDIR/dockerd.log" >&2
      DOCKERD_PID=""
      die "dockerd exited at start (log above, full: $LOGDIR/dockerd.log)"
    }
    sleep 0.5
  done
  "$DOCKER" info >/dev/null 2>&1 || {
    tail -n 20 "$LOGDIR/dockerd.log" >&2
    die "dockerd did not answer within 60 s (full log: $LOGDIR/dockerd.log)"
  }
  say "dockerd $("$DOCKER" version -f '{{.Server.Version}}') is up"
fi

bash "$ROOT/scripts/docker-standins.sh"

rc=0
"$PYTEST" -q -m docker -p no:cacheprovider "$ROOT/tests/docker" "$@" || rc=$?
[[ -f "$LOGDIR/figures.json" ]] && say "figures: $(cat "$LOGDIR/figures.json")"
say "done in $((SECONDS - T0)) s (pytest rc=$rc)"
exit "$rc"
