# Session 49's first call (~500 s): main built with the NaN-sign fix (never run on a GPU yet),
#  1. ctest -R quantize_cuda (the harness plants a negative NaN now);
#  2. the whole GPU suite (session 48's four failing delayed tests and the new negative-NaN test);
#  3. the KV write bench from DRAM (JSON), then the fused quantize bench (H100-only figures so far).
#   run(command="FP8EXT_COMMIT=<sha> CALL_BUDGET=560 bash bench/wip/call_s49a.sh", carry=[".whl", ".data"], timeout_s=580)
R=$PWD
B=${CALL_BUDGET:-560}
left() { echo $((B - SECONDS)); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
(timeout 60 ctest --test-dir $R/build/device -R quantize_cuda --output-on-failure > $OUT/ctest.log 2>&1; \
  echo "ctest rc $?"; tail -3 $OUT/ctest.log)
(cd /tmp && timeout $(( $(left) - 110 )) python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu.xml \
  $R/tests > $OUT/pytest.log 2>&1; echo "pytest rc $?"); tail -4 $OUT/pytest.log
grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -10
[ $(left) -gt 50 ] && (cd /tmp && timeout 45 python3 $R/bench/bench_decode.py --writes-only --out $OUT \
  > $OUT/bench_write.log 2>&1; tail -5 $OUT/bench_write.log)
[ $(left) -gt 60 ] && (cd /tmp && timeout $(( $(left) - 15 )) python3 $R/bench/bench_fused_quantize.py --out $OUT \
  > $OUT/bench_fused.log 2>&1; tail -11 $OUT/bench_fused.log)
echo "end at $SECONDS s"
cd $OUT && tar czf logs.tgz --remove-files *.log *.txt logs-*.tgz
