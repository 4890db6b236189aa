# soakd in a container. Two stages: the builder turns the source into wheels (soakd's
# own and one for each runtime dependency, no test extras); the runtime installs those
# wheels offline and nothing else, and runs soakd as an unprivileged user.
#
#   DOCKER_BUILDKIT=1 docker build -t soakd:local .
#   # behind a TLS-intercepting proxy: hand pip the CA bundle as the build secret `ca`
#   DOCKER_BUILDKIT=1 docker build --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt -t soakd:local .
#   docker run --rm -p 127.0.0.1:9464:9464 \
#     -v "$PWD/my-soak.yaml:/etc/soakd/soakd.yaml:ro" -v soakd-data:/var/lib/soakd soakd:local
#
# Contract (docs/deployment.md):
#   /etc/soakd/soakd.yaml   the config, mounted read-only; SOAKD__SECTION__KEY env overrides it
#   /var/lib/soakd          a volume: every run writes runs/<run-id>/ here (config, plan,
#                           JSON log, summary.json)
#   :9464                   /metrics, /healthz, /readyz, /status (bound on 0.0.0.0 in here,
#                           so that Prometheus in another container can scrape it)
#   SIGTERM                 stop sending, drain in-flight requests (run.drain_timeout), write
#                           the summary, exit 0. `docker stop -t` must exceed the drain timeout.
#
# No `# syntax=` line: it would make BuildKit fetch a frontend image from a registry, and
# Docker >= 20.10's built-in frontend already knows RUN --mount (bind, secret). So the
# build needs no registry beyond the base image's and PyPI.
#
# Base image: the Python minor version the project is developed and tested on (3.11), on
# Debian 12 like the development machines. Pinned by version; pin by digest as well
# (python:3.11.13-slim-bookworm@sha256:...) where your registry policy asks for it.

FROM python:3.11.13-slim-bookworm AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY soakd/ soakd/
# One wheel for soakd, one for each runtime dependency: the runtime stage installs from
# this folder with --no-index, so what runs is exactly what was resolved here.
# The optional build secret `ca` (a CA bundle) is what pip trusts when given: a
# TLS-intercepting proxy's CA. It is mounted for this step only, never in a layer.
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && pip wheel --wheel-dir /wheels .


FROM python:3.11.13-slim-bookworm AS runtime

# tini as PID 1: it forwards SIGTERM to soakd and reaps orphans. soakd drains on SIGTERM
# by itself, but only once its handlers are installed; as PID 1 it would ignore a
# SIGTERM that arrives earlier (the kernel applies no default action to PID 1), and
# `docker stop` would then wait for the kill. Without -g: only soakd gets the signal,
# and soakd stops the simulators it spawned itself, after the drain.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 \
    && rm -rf /var/lib/apt/lists/*

# A fixed numeric uid/gid (10001), so that a host directory or a Kubernetes
# securityContext can be set to match it.
RUN groupadd --system --gid 10001 soakd \
    && useradd --system --uid 10001 --gid soakd --no-create-home \
        --home-dir /var/lib/soakd --shell /usr/sbin/nologin soakd \
    && mkdir -p /etc/soakd /var/lib/soakd \
    && chown soakd:soakd /var/lib/soakd

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# The wheels come in through a bind mount, so they never land in a layer of this image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels /wheels/soakd-*.whl

WORKDIR /var/lib/soakd
VOLUME ["/var/lib/soakd"]
EXPOSE 9464

USER 10001:10001

STOPSIGNAL SIGTERM
# /healthz answers once the exporter is up (after the targets are opened). No curl in a
# slim image: Python's urllib does it. SOAKD_HEALTHZ_URL follows a changed --metrics-addr.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ.get('SOAKD_HEALTHZ_URL', 'http://127.0.0.1:9464/healthz'), timeout=4)"]

ENTRYPOINT ["tini", "--", "soakd"]
CMD ["run", "/etc/soakd/soakd.yaml", "--no-live", "--metrics-addr", "0.0.0.0:9464"]
