#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU only) for the llama.cpp-marked tests.
#
#   scripts/setup-llama-server.sh            # build once, then reuse
#   scripts/setup-llama-server.sh --print    # print the binary's path (no build)
#
# The sources are the llama.cpp vendored in the llama-cpp-python sdist on PyPI
# (vendor/llama.cpp). Only the `llama-server` target is built: Release,
# static libraries (BUILD_SHARED_LIBS=OFF), no OpenSSL/curl, no web UI (no
# download at build time), no OpenMP, portable x86-64-v3 code (AVX2/FMA/F16C,
# not -march=native: the cached binary may outlive the CPU it was built on).
#
# Idempotent. About 10 minutes on 2 cores the first time; afterwards a few ms.
#   1. <repo>/.cache/llama-server/<version>/llama-server exists -> done
#   2. else $SOAKD_LLAMA_CACHE/llama-server-<version> exists (a previous clone
#      on this machine built it; CI runs a fresh clone) -> copied in, done
#   3. else pip downloads the sdist, cmake builds, and the binary lands in both
#
# Environment:
#   LLAMA_CPP_PYTHON_VERSION  sdist version (default below)
#   SOAKD_LLAMA_CACHE         machine-wide cache (default /var/cache/soakd, or
#                             ~/.cache/soakd when that isn't writable)
#   SOAKD_LLAMA_JOBS          parallel compile jobs (default 2: shared machine)
#   PYTHON                    interpreter with pip (default <repo>/.venv/bin/python,
#                             else python3)
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST_DIR="$ROOT/.cache/llama-server/$VERSION"
DEST="$DEST_DIR/llama-server"
JOBS="${SOAKD_LLAMA_JOBS:-2}"

say() { printf 'setup-llama-server: %s\n' "$*"; }
die() { printf 'setup-llama-server: ERROR: %s\n' "$*" >&2; exit 1; }
tail_log() { [[ -f "$1" ]] && { echo "--- last lines of $1 ---" >&2; tail -n 40 "$1" >&2; }; return 0; }

if [[ "${1:-}" == "--print" ]]; then
    echo "$DEST"
    exit 0
fi
[[ $# -eq 0 ]] || die "usage: $0 [--print]"

machine_cache() {
    local c="${SOAKD_LLAMA_CACHE:-}"
    if [[ -z "$c" ]]; then
        c=/var/cache/soakd
        if ! mkdir -p "$c" 2>/dev/null || [[ ! -w "$c" ]]; then
            c="${XDG_CACHE_HOME:-$HOME/.cache}/soakd"
        fi
    fi
    mkdir -p "$c" || die "cannot create the cache directory $c (set SOAKD_LLAMA_CACHE)"
    echo "$c"
}

# A binary that starts and answers --version is usable; anything else is rebuilt.
works() { [[ -x "$1" ]] && "$1" --version >/dev/null 2>&1; }

if works "$DEST"; then
    exit 0
fi

MCACHE="$(machine_cache)"
SHARED="$MCACHE/llama-server-$VERSION"
mkdir -p "$DEST_DIR"

# Two runs at once (two test sessions, make -j) would build twice.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$MCACHE/llama-server-$VERSION.lock"
    flock -w 1800 9 || die "another setup-llama-server.sh held $MCACHE/llama-server-$VERSION.lock for 30 min"
    works "$DEST" && exit 0
fi

if works "$SHARED"; then
    cp -f "$SHARED" "$DEST.tmp" && mv -f "$DEST.tmp" "$DEST"
    say "reused $SHARED"
    exit 0
fi

# The toolchain, from Debian's packages when missing (a fresh machine).
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v make >/dev/null 2>&1 || missing+=(make)
if ((${#missing[@]})); then
    # shellcheck source=lib/apt.sh
    source "$ROOT/scripts/lib/apt.sh"
    apt_install setup-llama-server "${missing[@]}"
fi

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "'$PYTHON -m pip' does not work (set PYTHON=)"

WORK="$MCACHE/build-llama-server-$VERSION"
LOG="$WORK/build.log"
rm -rf "$WORK"
mkdir -p "$WORK/sdist"
T0=$SECONDS
say "building llama-server from llama-cpp-python==$VERSION (about 10 min on 2 cores; log: $LOG)"

PIP_DISABLE_PIP_VERSION_CHECK=1 "$PYTHON" -m pip download -q --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$WORK/sdist" >"$LOG" 2>&1 \
    || { tail_log "$LOG"; die "pip could not download the llama-cpp-python==$VERSION sdist"; }
SDIST="$(ls "$WORK"/sdist/llama_cpp_python-*.tar.gz 2>/dev/null | head -n 1)"
[[ -n "$SDIST" ]] || die "no llama_cpp_python-*.tar.gz in $WORK/sdist after pip download"
tar -xzf "$SDIST" -C "$WORK" || die "cannot unpack $SDIST"
SRC="$(ls -d "$WORK"/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | head -n 1)"
[[ -n "$SRC" && -f "$SRC/CMakeLists.txt" ]] || die "no vendor/llama.cpp/CMakeLists.txt in $SDIST"
rm -f "$SDIST"

# llama.cpp stamps its build number from `git rev-parse` in the source tree:
# keep git from walking up into whatever repository encloses the cache.
export GIT_CEILING_DIRECTORIES="$WORK"

BUILD="$WORK/build"
cmake -S "$SRC" -B "$BUILD" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_COMMIT="llama-cpp-python-$VERSION" \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_LLGUIDANCE=OFF \
    -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_CCACHE=OFF \
    -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF \
    >>"$LOG" 2>&1 \
    || { tail_log "$LOG"; die "cmake configure failed"; }
cmake --build "$BUILD" --target llama-server -j "$JOBS" >>"$LOG" 2>&1 \
    || { tail_log "$LOG"; die "cmake build of llama-server failed"; }

BIN="$BUILD/bin/llama-server"
works "$BIN" || { tail_log "$LOG"; die "$BIN was built but does not run (--version)"; }
strip "$BIN" 2>/dev/null || true
cp -f "$BIN" "$SHARED.tmp" && mv -f "$SHARED.tmp" "$SHARED"
cp -f "$BIN" "$DEST.tmp" && mv -f "$DEST.tmp" "$DEST"
cp -f "$LOG" "$DEST_DIR/build.log"
rm -rf "$WORK"
say "built $DEST in $((SECONDS - T0)) s (also $SHARED)"
