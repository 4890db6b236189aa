#!/usr/bin/env bash
# Set up LiteLLM's proxy, the real third-party gateway the proxied-endpoint tests put in
# front of vLLM (tests/integration/test_gateway_litellm.py).
#
#   scripts/setup-litellm.sh
#
# Idempotent; a rerun with everything in place takes about a second.
#   1. creates .venv-litellm (its own venv: LiteLLM's pins must not decide soakd's)
#   2. installs litellm[proxy]==1.108.7, prisma and prometheus_client there unless present
#      (1.108.8 and later pin companion packages this machine's registry does not serve;
#      prisma, the Python package only, makes a wrong key a proper JSON error, not a 500)
#   3. checks that the proxy's entry point imports (once; remembered in .soakd-setup-ok)
#
# Environment:
#   PYTHON               interpreter used to create the venv (default: python3)
#   SOAKD_LITELLM_VENV   venv directory (default: <repo>/.venv-litellm)
set -euo pipefail

LITELLM_VERSION=1.108.7

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="${SOAKD_LITELLM_VENV:-$ROOT/.venv-litellm}"
CACHE="$ROOT/.cache"
PIP_LOG="$CACHE/setup-litellm-pip.log"
VPY="$VENV/bin/python"
STAMP="$VENV/.soakd-setup-ok"

export PIP_DISABLE_PIP_VERSION_CHECK=1 LITELLM_LOCAL_MODEL_COST_MAP=True
unset PYTHONPATH PYTHONHOME

say() { printf 'setup-litellm: %s\n' "$*"; }
die() { printf 'setup-litellm: ERROR: %s\n' "$*" >&2; exit 1; }
tail_log() { [[ -f "$1" ]] && { echo "--- last lines of $1 ---" >&2; tail -n 30 "$1" >&2; }; return 0; }

mkdir -p "$CACHE"
T0=$SECONDS

if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/setup-litellm.lock"
    flock -w 600 9 || die "another setup-litellm.sh held $CACHE/setup-litellm.lock for 10 min"
fi

# 1. venv
if [[ ! -x "$VPY" ]] || ! "$VPY" -c 'import pip' >/dev/null 2>&1; then
    command -v "$PYTHON" >/dev/null 2>&1 || die "no '$PYTHON' on PATH (set PYTHON=/path/to/python3)"
    say "creating $VENV"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" \
        || { rm -rf "$VENV"; die "'$PYTHON -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"; }
fi

installed_version() { "$VPY" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true; }

# 2. the proxy and the two packages it needs here
if [[ "$(installed_version litellm)" != "$LITELLM_VERSION" || -z "$(installed_version prisma)" \
      || -z "$(installed_version prometheus_client)" ]]; then
    say "installing litellm[proxy]==$LITELLM_VERSION (about a minute; log: $PIP_LOG)"
    rm -f "$STAMP"
    if ! "$VPY" -m pip install "litellm[proxy]==$LITELLM_VERSION" prisma prometheus_client \
            >"$PIP_LOG" 2>&1; then
        tail_log "$PIP_LOG"
        die "pip install litellm[proxy]==$LITELLM_VERSION failed (full log: $PIP_LOG)"
    fi
fi

# 3. the import the proxy needs (slow, ~20 s on 2 cores: done once, then remembered)
if [[ "$(cat "$STAMP" 2>/dev/null)" != "$LITELLM_VERSION" ]]; then
    if ! out="$("$VPY" -c 'import litellm.proxy.proxy_server, prisma, openai' 2>&1)"; then
        printf '%s\n' "$out" | tail -n 20 >&2
        die "'import litellm.proxy.proxy_server' fails in $VENV; remove it (rm -rf $VENV) and run this again"
    fi
    printf '%s\n' "$LITELLM_VERSION" >"$STAMP"
fi
[[ -x "$VENV/bin/litellm" ]] || die "no litellm entry point in $VENV/bin"

say "ready: litellm $LITELLM_VERSION, venv $VENV ($((SECONDS - T0)) s)"
