#!/usr/bin/env bash
# Installs (scripts/install.sh), then runs the C++ harness (ctest, on the same
# CMake build as the wheel) and pytest from outside the source tree against the
# installed package. GPU tests skip with a reason where there is no GPU.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${FP8EXT_VENV:-$ROOT/.venv}"
export FP8EXT_BUILD_DIR="${FP8EXT_BUILD_DIR:-$ROOT/build/wheel}"

bash "$ROOT/scripts/install.sh"

echo "== ctest"
CTEST="$VENV/bin/ctest"; [ -x "$CTEST" ] || CTEST=ctest
"$CTEST" --test-dir "$FP8EXT_BUILD_DIR" --output-on-failure

echo "== pytest"
WORK="$(mktemp -d)"
cd "$WORK"
"$VENV/bin/python" -c "import fp8ext, sys; assert '$ROOT/python' not in fp8ext.__file__; print('testing', fp8ext.__file__)"
"$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider "$ROOT/tests"
