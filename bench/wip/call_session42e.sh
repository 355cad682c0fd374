# Session 42's last call (~330 s; ~430 on an H200): main built; on an H200 bench_quantize first (issue 3's
# figure with the zero-free amax slots); then ctest and the GPU tests helper-27's audit changed.
#   run(command="bash bench/wip/call_session42e.sh", carry=[".whl"], timeout_s=480)
R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
if grep -q H200 $OUT/gpu0.txt; then
  (cd /tmp && PYTHONPATH=/tmp/site timeout 130 python3 $R/bench/bench_quantize.py --out $OUT > $OUT/bench_quantize.log 2>&1)
  tail -14 $OUT/bench_quantize.log
fi
(ctest --test-dir build/device --output-on-failure > $OUT/ctest.log 2>&1; tail -3 $OUT/ctest.log) &
(cd /tmp && timeout 100 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu.xml \
  "$R/tests/test_kv_cache_cuda.py::test_non_finite_values_propagate_as_in_the_reference" \
  "$R/tests/test_kv_cache_cuda.py::test_int64_tables_out_of_int32_range_give_nan" \
  "$R/tests/test_kv_cache_cuda.py::test_bad_pages_and_lengths_give_nan_not_a_crash" \
  "$R/tests/test_kv_cache_cuda.py::test_manager_on_cuda_matches_cpu_and_replays_in_a_cuda_graph" \
  "$R/tests/test_quantize_cuda.py::test_cuda_graph_capture" \
  "$R/tests/test_scaled_mm_cuda.py::test_non_finite_codes_scales_and_bias_in_every_kernel" \
  $R/tests/test_pdl_cuda.py > $OUT/pytest.log 2>&1); tail -12 $OUT/pytest.log
wait
cd $OUT && tar czf logs.tgz --remove-files *.log run_build.txt
