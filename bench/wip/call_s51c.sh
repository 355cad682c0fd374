# Session 51's short call (~280 s, for what is left of the budget): main built; the paged
# decode's den-0 NaN change (test_kv_cache_cuda.py), the GEMM and paged harnesses (ctest:
# the new worst-row/column check), then the decode suite if time is left.
#   run(command="FP8EXT_COMMIT=<sha> CALL_BUDGET=280 bash bench/wip/call_s51c.sh", carry=[".whl", ".data"], timeout_s=300)
R=$PWD
B=${CALL_BUDGET:-280}
left() { echo $((B - SECONDS)); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
echo "built at $SECONDS s"
(cd /tmp && timeout $(( $(left) - 70 )) python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/kv.xml \
  $R/tests/test_kv_cache_cuda.py > $OUT/pytest.log 2>&1; echo "pytest rc $? at $SECONDS s"); tail -3 $OUT/pytest.log
(timeout $(( $(left) - 5 )) ctest --test-dir $R/build/device --output-on-failure -R "scaled_mm|blockwise|paged" \
  > $OUT/ctest.log 2>&1; echo "ctest rc $? at $SECONDS s"; grep -E "tests passed|Failed|\*\*\*|Passed" $OUT/ctest.log | tail -6)
[ $(left) -gt 35 ] && (cd /tmp && timeout $(( $(left) - 5 )) python3 $R/bench/bench_decode.py --out $OUT > $OUT/decode.log 2>&1; \
  echo "decode rc $? at $SECONDS s"; tail -12 $OUT/decode.log)
echo "end at $SECONDS s"
cd $OUT && tar czf logs.tgz --remove-files *.log *.txt logs-*.tgz
