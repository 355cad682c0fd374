# Session 43, helper-31's mends (~180 s with the start): the library and binding built
# WITHOUT the CUTLASS GEMMs (no .whl carried: ~70 s), the quantize harness, and the
# RMSNorm tests of test_fused_quantize (the ring kernel, its fence and host rule).
#   run(command="bash bench/wip/call_session43d.sh", timeout_s=170)
R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
for c in /usr/bin/g++ /usr/bin/g++-14 /usr/bin/g++-13 /usr/bin/g++-12; do
  if [ -x "$c" ]; then export CXX="$c" CUDAHOSTCXX="$c"; break; fi
done
export CUDA_HOME=/usr/local/cuda FP8EXT_BUILD_DIR=$R/build/device MAX_JOBS=16
unset CUTLASS_DIR
t0=$SECONDS; timeout 110 python3 -m pip install -q --no-build-isolation --no-deps $R > $OUT/build.log 2>&1
echo "build rc=$? ($((SECONDS - t0)) s)"; tail -3 $OUT/build.log
(timeout 20 $R/build/device/csrc/tests/fp8ext_test_quantize_cuda > $OUT/harness.log 2>&1; echo "harness rc=$?"; tail -1 $OUT/harness.log)
(cd /tmp && timeout 45 python3 -m pytest -q -x -p no:cacheprovider -m gpu --junitxml=$OUT/gpu.xml \
  $R/tests/test_fused_quantize.py -k "ring" > $OUT/pytest.log 2>&1); tail -2 $OUT/pytest.log
cd $OUT && tar czf logs.tgz --remove-files *.log
