#!/usr/bin/env bash
# One run on the lent H200 (see ../shared/DEVICE.md): install the carried
# CUTLASS wheel, build with that machine's torch, run ctest, the tests (GPU ones
# included) and the benchmarks. Logs and JSON go to OUT.
#   usage: scripts/device/run.sh OUT [stage ...]
#   stages: build ctest sanitize test bench (the default: all of these), profile (ncu on the quantize kernels),
#   profile_l2 (ncu on current scaling's two kernels without flushing L2 between them: does the second pass hit L2?)
#   FP8EXT_COMMIT=<sha> names the commit in the benchmark JSON (the device copy's .git may be stale).
# Carry .whl (the nvidia-cutlass and torchao wheels) and .data (real SmolLM2 layers for
# tests/test_smollm2_layers_cuda.py: scripts/make_smollm2_layers.py writes them) with the call.
set -uo pipefail
OUT="${1:?usage: run.sh OUT [stage ...]}"; shift
STAGES="${*:-build ctest sanitize test bench}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$ROOT/build/device"
mkdir -p "$OUT"
cd "$ROOT"
status=0
# At most 8 files come back from the device: the logs go into one archive, also
# when a step or the whole call is cut short.
pack() { (cd "$OUT" && tar czf "logs-$(echo $STAGES | tr ' ' -).tgz" *.log 2>/dev/null && rm -f *.log); }
trap pack EXIT
STEP_TIMEOUT=${STEP_TIMEOUT:-300}  # seconds; a hung step must not eat the whole call
has() { [[ " $STAGES " == *" $1 "* ]]; }
step() {  # step NAME CMD...: runs CMD, logs to OUT/NAME.log, remembers failures
  local name="$1"; shift
  local t0=$SECONDS
  echo "== $name"
  if timeout "$STEP_TIMEOUT" "$@" > "$OUT/$name.log" 2>&1; then
    echo "   ok ($((SECONDS - t0)) s)"
  else
    echo "   FAILED ($((SECONDS - t0)) s), tail of $name.log:"; tail -40 "$OUT/$name.log"; status=1
  fi
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" >> "$OUT/gpu.txt" 2>&1

# The carried wheels (.whl/: nvidia-cutlass for the build, torchao for the
# FP8Linear benchmark's anchor) go to /tmp/site; the benchmarks see it on PYTHONPATH.
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  > "$OUT/wheels.log" 2>&1
if has build; then
  # The image's default g++ (/opt/gcc, a Red Hat toolset) links parts of libstdc++
  # statically; with the C++11 ABI that crashed the first exception message
  # formatted in the extension (seen 2026-11-29). Prefer the system compiler.
  for c in /usr/bin/g++ /usr/bin/g++-14 /usr/bin/g++-13 /usr/bin/g++-12; do
    if [ -x "$c" ]; then export CXX="$c" CUDAHOSTCXX="$c"; break; fi
  done
  echo "host compiler: ${CXX:-default}" | tee "$OUT/compiler.txt"
  export CUTLASS_DIR=/tmp/site/cutlass_library/source CUDA_HOME=/usr/local/cuda FP8EXT_BUILD_DIR="$BUILD" MAX_JOBS=16
  rm -rf "$BUILD"
  step build python3 -m pip install -v --no-build-isolation --no-deps "$ROOT"
fi
has ctest && step ctest ctest --test-dir "$BUILD" --output-on-failure
if has ctest && [ -f "$BUILD/libfp8ext_kernels.a" ]; then  # the GEMMs must use wgmma on FP8 (QGMMA)
  step sass bash -c "/usr/local/cuda/bin/cuobjdump -sass '$BUILD/libfp8ext_kernels.a' | grep -oE 'QGMMA[.A-Z0-9x]*' | sort | uniq -c"
fi
if has sanitize; then  # memcheck over the C++ CUDA harness (FP8EXT_TEST_QUICK: a representative subset)
  for t in "$BUILD"/csrc/tests/fp8ext_test_*cuda*; do
    [ -x "$t" ] && step "memcheck-$(basename "$t")" env FP8EXT_TEST_QUICK=1 \
      /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 1 "$t"
  done
fi
if has test; then
  export FP8EXT_TEST_SEED=${FP8EXT_TEST_SEED:-$RANDOM}
  step test bash -c "cd /tmp && python3 -m pytest -q -rs -p no:cacheprovider --junitxml=$OUT/pytest.xml $ROOT/tests"
  tail -3 "$OUT/test.log"
fi
if has bench && [ -d "$ROOT/bench" ] && ls "$ROOT"/bench/bench_*.py > /dev/null 2>&1; then
  for b in "$ROOT"/bench/bench_*.py; do
    step "$(basename "$b" .py)" bash -c "cd /tmp && PYTHONPATH=/tmp/site python3 $b --out $OUT"
    tail -25 "$OUT/$(basename "$b" .py).log"
  done
fi
if has profile; then
  step profile /usr/local/cuda/bin/ncu --clock-control none --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats \
    python3 "$ROOT/scripts/device/profile_quantize.py"
fi
if has profile_l2; then
  step profile_l2 /usr/local/cuda/bin/ncu --clock-control none --cache-control none -k regex:"amax|quantize_chunks" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis python3 "$ROOT/scripts/device/profile_quantize.py" --per-tensor
fi
exit $status
