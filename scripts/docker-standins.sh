#!/usr/bin/env bash
# Build the local stand-ins for the upstream images that tests/docker/ cannot pull (no
# image registry on the test machines), from Debian 12 (bookworm) packages:
#
#   python:3.11.13-slim-bookworm   the Dockerfile's base: Debian's Python 3.11 and pip, with
#                                  python/pip at /usr/local/bin like the official image
#   soakd-test/prometheus:bookworm     Debian's prometheus (2.42), ENTRYPOINT like prom/prometheus
#   soakd-test/alertmanager:bookworm   Debian's prometheus-alertmanager (0.25), like prom/alertmanager
#
#   scripts/docker-standins.sh          # needs a running Docker engine
#
# Each root filesystem is made once by mmdebstrap and cached as a tarball under
# $SOAKD_DOCKER_CACHE (default /var/cache/soakd/docker); `docker import` then loads it in
# seconds. Images already in the engine are kept. A real python:3.11.13-slim-bookworm
# (one that is not labelled as this stand-in) is never replaced. mmdebstrap's output
# goes to a log file next to the tarballs.
#
# Environment: DOCKER (the docker CLI, default docker), SOAKD_DEBIAN_MIRROR (default
# http://deb.debian.org/debian; the security suite comes from deb.debian.org/debian-security).
set -euo pipefail

CACHE="${SOAKD_DOCKER_CACHE:-/var/cache/soakd/docker}"
DOCKER="${DOCKER:-docker}"
MIRROR="${SOAKD_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY="${SOAKD_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
LOG="$CACHE/standins.log"
LABEL=org.soakd.standin

PYTHON_TAG=python:3.11.13-slim-bookworm
PROMETHEUS_TAG=soakd-test/prometheus:bookworm
ALERTMANAGER_TAG=soakd-test/alertmanager:bookworm

say() { printf 'docker-standins: %s\n' "$*"; }
die() { printf 'docker-standins: ERROR: %s\n' "$*" >&2; exit 1; }

mkdir -p "$CACHE" || die "cannot create $CACHE (set SOAKD_DOCKER_CACHE)"
command -v mmdebstrap >/dev/null 2>&1 || die "mmdebstrap missing (scripts/setup-docker.sh installs it)"
"$DOCKER" info >/dev/null 2>&1 || die "no Docker engine answers '$DOCKER info' (scripts/test-docker.sh starts one)"

exec 9>"$CACHE/standins.lock"
flock -w 1800 9 || die "another docker-standins.sh held $CACHE/standins.lock for 30 min"

# The recipe of each root filesystem. Its hash names the tarball: change a recipe and
# the stand-in is rebuilt.
PY_PKGS=python3.11,python3-pip,python3-venv,ca-certificates,netbase,tzdata
PY_HOOKS=(
  'rm -f "$1"/usr/lib/python3.11/EXTERNALLY-MANAGED'
  'for n in python python3; do ln -sf /usr/bin/python3.11 "$1/usr/local/bin/$n"; done'
  'for n in pip pip3; do ln -sf /usr/bin/pip3 "$1/usr/local/bin/$n"; done'
)
PROM_PKGS=prometheus,prometheus-alertmanager,wget,ca-certificates,tzdata
PROM_HOOKS=(
  'mkdir -p "$1/prometheus" "$1/alertmanager" && chown 65534:65534 "$1/prometheus" "$1/alertmanager"'
)

# rootfs NAME PACKAGES HOOK... -> prints the cached tarball's path, building it if needed
rootfs() {
  local name=$1 pkgs=$2; shift 2
  local key tar t0 args=()
  key="$(printf '%s\n' v1 "$MIRROR" "$pkgs" "$@" | sha256sum | cut -c1-12)"
  tar="$CACHE/$name-bookworm-$key.tar"
  if [[ -s "$tar" ]]; then
    printf '%s\n' "$tar"
    return
  fi
  for hook in "$@"; do args+=(--customize-hook="$hook"); done
  t0=$SECONDS
  say "building the $name root filesystem with mmdebstrap (a minute or two; log: $LOG)" >&2
  if ! mmdebstrap --variant=minbase --format=tar --include="$pkgs" \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        "${args[@]}" bookworm "$tar.tmp" \
        "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" \
        "deb $SECURITY bookworm-security main" </dev/null >>"$LOG" 2>&1; then
    rm -f "$tar.tmp"
    tail -n 20 "$LOG" >&2
    die "mmdebstrap of $name failed (full log: $LOG)"
  fi
  mv -f "$tar.tmp" "$tar"
  rm -f "$CACHE/$name-bookworm-"*.tar.tmp
  say "built $tar in $((SECONDS - t0)) s" >&2
  printf '%s\n' "$tar"
}

# image TAG TARBALL CHANGE... -> imports the tarball as TAG unless TAG is that already
image() {
  local tag=$1 tar=$2; shift 2
  local have key args=()
  key="$(basename "$tar" .tar)"
  have="$("$DOCKER" image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$tag" 2>/dev/null || true)"
  if [[ "$have" == "$key" ]]; then
    return
  fi
  if [[ -n "$("$DOCKER" image ls -q "$tag")" && -z "$have" ]]; then
    say "$tag is a real image, kept"
    return
  fi
  for change in "$@" "LABEL $LABEL=$key"; do args+=(--change "$change"); done
  "$DOCKER" import "${args[@]}" "$tar" "$tag" >/dev/null || die "docker import of $tar as $tag failed"
  say "imported $tag"
}

T0=$SECONDS
py="$(rootfs python "$PY_PKGS" "${PY_HOOKS[@]}")"
prom="$(rootfs prometheus "$PROM_PKGS" "${PROM_HOOKS[@]}")"

image "$PYTHON_TAG" "$py" \
  'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  'ENV LANG=C.UTF-8' 'ENV PYTHON_VERSION=3.11' 'CMD ["python3"]'
image "$PROMETHEUS_TAG" "$prom" \
  'USER nobody' 'WORKDIR /prometheus' 'EXPOSE 9090' \
  'ENTRYPOINT ["/usr/bin/prometheus"]' \
  'CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]'
image "$ALERTMANAGER_TAG" "$prom" \
  'USER nobody' 'WORKDIR /alertmanager' 'EXPOSE 9093' \
  'ENTRYPOINT ["/usr/bin/prometheus-alertmanager"]' \
  'CMD ["--config.file=/etc/alertmanager/alertmanager.yml", "--storage.path=/alertmanager"]'
say "ready: $PYTHON_TAG, $PROMETHEUS_TAG, $ALERTMANAGER_TAG ($((SECONDS - T0)) s)"
