# Session 51's second call (~560 s): main built; the paged decode's den-0 NaN change
# (test_kv_cache_cuda.py, the paged harness under memcheck), the GEMM harnesses' new
# worst-row/column check (ctest), the decode suite (the merge changed), then the GEMM quick
# suite (issue 4) and the block-wise suite (issue 5) with what is left.
#   run(command="FP8EXT_COMMIT=<sha> CALL_BUDGET=560 bash bench/wip/call_s51b.sh", carry=[".whl", ".data"], timeout_s=580)
R=$PWD
B=${CALL_BUDGET:-560}
left() { echo $((B - SECONDS)); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
echo "built at $SECONDS s"
(cd /tmp && timeout $(( $(left) - 60 )) python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/kv.xml \
  $R/tests/test_kv_cache_cuda.py > $OUT/pytest.log 2>&1; echo "pytest rc $? at $SECONDS s"); tail -3 $OUT/pytest.log
(timeout 150 ctest --test-dir $R/build/device --output-on-failure > $OUT/ctest.log 2>&1; echo "ctest rc $? at $SECONDS s"; \
  grep -E "tests passed|Failed|\*\*\*|Passed" $OUT/ctest.log | tail -10)
(FP8EXT_TEST_QUICK=1 timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 1 \
  $R/build/device/csrc/tests/fp8ext_test_paged_kv_cuda > $OUT/memcheck.log 2>&1; echo "memcheck rc $? at $SECONDS s"; tail -3 $OUT/memcheck.log)
bench() {  # bench NAME SECONDS CMD...: runs CMD in /tmp if that many seconds are left, log to OUT/NAME.log
  local name=$1 need=$2; shift 2
  if [ $(left) -gt $need ]; then
    (cd /tmp && PYTHONPATH=/tmp/site timeout $(( $(left) - 10 )) "$@" > $OUT/$name.log 2>&1; echo "$name rc $? at $SECONDS s")
    tail -14 $OUT/$name.log
  fi
}
bench decode 60 python3 $R/bench/bench_decode.py --out $OUT
bench gemm 90 python3 $R/bench/bench_gemm.py --out $OUT
bench blockwise 60 python3 $R/bench/bench_gemm_blockwise.py --out $OUT
echo "end at $SECONDS s"
cd $OUT && tar czf logs.tgz --remove-files *.log *.txt logs-*.tgz
