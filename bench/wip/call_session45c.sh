# Session 45's last call (~300 s): the tree with zeros-fast-everywhere landed, built, and the GPU
# tests of every kernel whose SASS it changed (quantize per-row / tensor / kept / small /
# group / block, the KV write) and of their users; then the quantize and paged-KV harnesses.
#   run(command="CALL_BUDGET=330 bash bench/wip/call_session45c.sh", carry=[".whl", ".data"], timeout_s=330)
R=$PWD
B=${CALL_BUDGET:-330}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
(cd /tmp && timeout $((B - 25 - SECONDS)) python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu.xml \
  $R/tests/test_quantize_cuda.py $R/tests/test_kv_cache_cuda.py $R/tests/test_rotary_kv_write.py $R/tests/test_pdl_cuda.py \
  $R/tests/test_fp8_linear.py $R/tests/test_serving.py $R/tests/test_smollm2_layers_cuda.py > $OUT/pytest.log 2>&1; \
  echo "pytest rc $?"); tail -3 $OUT/pytest.log
[ $SECONDS -lt $((B - 40)) ] && (timeout $((B - 15 - SECONDS)) ctest --test-dir $R/build/device -R "quantize_cuda|paged" \
  --output-on-failure > $OUT/ctest.log 2>&1; echo "ctest rc $?"; grep -E "tests passed|Passed|Failed" $OUT/ctest.log | tail -3)
cd $OUT && tar czf logs.tgz --remove-files *.log *.txt logs-*.tgz
