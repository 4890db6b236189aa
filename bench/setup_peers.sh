#!/usr/bin/env bash
# Install the peer benchmark tools, each in its own venv under .cache/bench/venvs:
#   guidellm (with the CPU torch build from pip's find-links, not the 6 GB CUDA one)
#   aiperf
# `vllm bench serve` comes from .venv-vllm (scripts/setup-vllm.sh), not installed here.
# Idempotent: a venv whose tool already imports is left alone. A tool that fails to
# install is recorded in .cache/bench/venvs/<tool>.status and the script goes on.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENVS="$ROOT/.cache/bench/venvs"
PY="${PY:-python3}"
GUIDELLM_VERSION="${GUIDELLM_VERSION:-0.8.1}"
AIPERF_VERSION="${AIPERF_VERSION:-0.13.0}"
TORCH_CPU="${TORCH_CPU:-torch==2.13.0+cpu}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$VENVS"

install() {  # name import-check pip-args...
    local name="$1" check="$2"; shift 2
    local venv="$VENVS/$name" log="$VENVS/$name.log"
    if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
        echo "bench: $name ready ($("$venv/bin/python" -c "$check" 2>/dev/null | tail -1))"
        return 0
    fi
    echo "bench: installing $name into $venv (log: $log)"
    rm -rf "$venv"
    if "$PY" -m venv "$venv" >"$log" 2>&1 \
        && "$venv/bin/pip" install -q --upgrade pip >>"$log" 2>&1 \
        && "$venv/bin/pip" install "$@" >>"$log" 2>&1 \
        && "$venv/bin/python" -c "$check" >>"$log" 2>&1; then
        echo "ok $("$venv/bin/python" -c "$check" 2>/dev/null | tail -1)" >"$VENVS/$name.status"
        echo "bench: $name installed"
    else
        echo "failed: $(tail -n 3 "$log" | tr '\n' ' ')" >"$VENVS/$name.status"
        echo "bench: $name FAILED to install; see $log (going on)"
    fi
}

# Only where a tool lets us: torch pinned to the CPU build that pip's find-links holds.
install guidellm "import guidellm, torch; from importlib.metadata import version; print(version('guidellm'), torch.__version__)" \
    "guidellm==$GUIDELLM_VERSION" "$TORCH_CPU" psutil
install aiperf "import aiperf; from importlib.metadata import version; print(version('aiperf'))" \
    "aiperf==$AIPERF_VERSION"

VLLM_PY="$ROOT/.venv-vllm/bin/python"
if [[ -x "$VLLM_PY" ]] && "$VLLM_PY" -c "import vllm.benchmarks.serve" >/dev/null 2>&1; then
    echo "bench: vllm bench serve ready (vllm $("$VLLM_PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -1))"
else
    echo "bench: .venv-vllm missing or without vllm.benchmarks; run 'make setup-vllm' (vllm bench serve skipped)"
fi
