# Session 53's first call (~560 s): main built; the rotary KV write in Hugging Face's table
# convention (kernel changed) and session 52's owed cos/sin check: the rotary, paged-KV and
# serving GPU tests and the paged C++ harness; then, on an H200 only, the
# issues' figures (session 50's call_s50c.sh: layer stack, decode suite + KV write, GEMM quick
# suite, block-wise GEMM, GEMV whole rounds). On an H100 it stops after the tests.
#   run(command="FP8EXT_COMMIT=<sha> CALL_BUDGET=560 bash bench/wip/call_s53a.sh", carry=[".whl", ".data"], timeout_s=580)
source bench/wip/call_lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
python3 -c "import fp8ext" 2>/dev/null || { bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt; }
echo "built at $SECONDS s"
(cd /tmp && timeout 200 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/kv.xml \
  $R/tests/test_rotary_kv_write.py $R/tests/test_kv_cache_cuda.py $R/tests/test_serving.py $R/tests/test_fp8_linear.py $R/tests/test_fp8_linear_hf.py > $OUT/pytest_kv.log 2>&1; \
  echo "pytest rc $? at $SECONDS s")
tail -3 $OUT/pytest_kv.log
(timeout 60 ctest --test-dir $R/build/device --output-on-failure -R paged > $OUT/ctest.log 2>&1; echo "ctest rc $? at $SECONDS s"; \
  grep -E "tests passed|Failed|\*\*\*|Passed" $OUT/ctest.log | tail -4)
if grep -q H200 $OUT/gpu0.txt; then
  h200_figures
fi
echo "end at $SECONDS s"
cd $OUT && tar czf logs.tgz --remove-files *.log *.txt logs-*.tgz
