#!/usr/bin/env bash
# Re-installs the package into .venv after a change (incremental CMake build).
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} .venv/bin/pip install --no-build-isolation --no-deps -q . 2>&1 | grep -v "^WARNING: Location" || true
