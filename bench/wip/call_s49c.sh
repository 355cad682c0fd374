# Session 49's third call (ran as below, 277 s on an H100): the fp16 NaN-sign fix (to_float<__half>);
# ctest -R quantize_cuda; the quantize, fused, KV and serving GPU tests; the KV write bench from DRAM
# (its PyTorch anchor fixed). Build first:
#   run(command="FP8EXT_COMMIT=<sha> bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; CALL_BUDGET=300 bash bench/wip/call_s49c.sh",
#       carry=[".whl", ".data"])
R=$PWD
B=${CALL_BUDGET:-400}
left() { echo $((B - SECONDS)); }
(timeout 60 ctest --test-dir $R/build/device -R quantize_cuda --output-on-failure > $OUT/ctest.log 2>&1; \
  echo "ctest rc $?"; tail -2 $OUT/ctest.log)
(cd /tmp && timeout $(( $(left) - 60 )) python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu.xml \
  $R/tests/test_quantize_cuda.py $R/tests/test_fused_quantize.py $R/tests/test_kv_cache_cuda.py \
  $R/tests/test_rotary_kv_write.py $R/tests/test_serving.py > $OUT/pytest.log 2>&1; echo "pytest rc $?")
tail -2 $OUT/pytest.log; grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -10
[ $(left) -gt 30 ] && (cd /tmp && timeout $(( $(left) - 10 )) python3 $R/bench/bench_decode.py --writes-only --out $OUT \
  > $OUT/bench_write.log 2>&1; tail -6 $OUT/bench_write.log)
echo "end at $SECONDS s"
cd $OUT && tar czf logs.tgz --remove-files *.log
