# Session 48, second call: the delayed-scaling mismatch's diagnosis, the KV write
# reordered (loads before the slot) with its tests, bench and PyTorch anchor,
# ctest with room for the GEMM harness.
#   run(command="FP8EXT_COMMIT=<sha> CALL_BUDGET=400 bash bench/wip/call_s48b.sh", carry=[".whl", ".data"], timeout_s=420)
R=$PWD
B=${CALL_BUDGET:-400}
left() { echo $((B - SECONDS)); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
(cd /tmp && timeout 60 python3 $R/bench/wip/diag_delayed.py > $OUT/diag.log 2>&1; echo "diag rc $?"); cat $OUT/diag.log | head -60
(cd /tmp && timeout 120 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/kv.xml \
  $R/tests/test_kv_cache_cuda.py $R/tests/test_rotary_kv_write.py $R/tests/test_serving.py > $OUT/pytest_kv.log 2>&1; echo "pytest kv rc $?"); tail -3 $OUT/pytest_kv.log
[ $(left) -gt 60 ] && (cd /tmp && timeout 60 python3 $R/bench/bench_decode.py --writes-only --out $OUT \
  > $OUT/bench_write.log 2>&1; tail -5 $OUT/bench_write.log)
[ $(left) -gt 60 ] && (timeout $(( $(left) > 150 ? 150 : $(left) - 30 )) ctest --test-dir $R/build/device --output-on-failure \
  > $OUT/ctest.log 2>&1; echo "ctest rc $?"; grep -E "tests passed|Failed|\*\*\*|Test #" $OUT/ctest.log | tail -10)
echo "end at $SECONDS s"
cd $OUT && tar czf logs.tgz --remove-files *.log *.txt logs-*.tgz
