# Session 42's second call (~400 s): the zero-free eager amax slots (amax_slots.h) built, the C++
# harness and test_quantize_cuda run, then per-tensor current scaling timed with and without them in
# one process (ab_quant_env: static as the control), and bench_quantize on an H200.
#   run(command="bash bench/wip/call_session42b.sh", carry=[".whl"])
R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
(ctest --test-dir build/device --output-on-failure > $OUT/ctest.log 2>&1; tail -3 $OUT/ctest.log) &
(cd /tmp && timeout 200 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu.xml \
  $R/tests/test_quantize_cuda.py > $OUT/pytest.log 2>&1); tail -3 $OUT/pytest.log
wait
grep -B2 -A30 'zeroed_amax_slots' $OUT/ctest.log | grep -i 'fail\|expect' | head -5
(cd /tmp && timeout 120 python3 $R/scripts/device/ab_quant_env.py --cases per_tensor_current static \
  --settings - FP8EXT_QUANT_ZERO_FREE=0 --rounds 5 --out $OUT > $OUT/ab.log 2>&1); tail -4 $OUT/ab.log
if grep -q H200 $OUT/gpu0.txt; then
  (cd /tmp && PYTHONPATH=/tmp/site timeout 150 python3 $R/bench/bench_quantize.py --out $OUT > $OUT/bench_quantize.log 2>&1)
  tail -14 $OUT/bench_quantize.log
fi
cd $OUT && tar czf logs.tgz --remove-files *.log run_build.txt
