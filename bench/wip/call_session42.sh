# Session 42's first device call (~300 s warm-start): main + packed-amax.patch built once, then the GPU
# tests that main's unrun changes and the patch need (the quantize / KV binding checks of f6f7b5f and 59411ca,
# the fused row quantizers' subnormal rows), ctest, and on an H200 bench_quantize (issue 3's figure).
#   run(command="bash bench/wip/call_session42.sh", carry=[".whl"])
set -x
R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt
git apply bench/wip/packed-amax.patch || echo "PATCH DID NOT APPLY"
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
(ctest --test-dir build/device --output-on-failure > $OUT/ctest.log 2>&1; tail -3 $OUT/ctest.log)
(cd /tmp && timeout 240 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu.xml \
  $R/tests/test_quantize_cuda.py $R/tests/test_kv_cache_cuda.py $R/tests/test_fused_quantize.py \
  $R/tests/test_rotary_kv_write.py > $OUT/pytest.log 2>&1); tail -4 $OUT/pytest.log
if grep -q H200 $OUT/gpu0.txt; then
  (cd /tmp && PYTHONPATH=/tmp/site timeout 150 python3 $R/bench/bench_quantize.py --out $OUT > $OUT/bench_quantize.log 2>&1)
  tail -14 $OUT/bench_quantize.log
fi
cd $OUT && tar czf logs.tgz --remove-files *.log run_build.txt
