set -x
R=$PWD
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
(cd /tmp && timeout 200 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu_fix.xml \
  $R/tests/test_kv_cache_cuda.py $R/tests/test_rotary_kv_write.py > $OUT/pytest_fix.log 2>&1); tail -3 $OUT/pytest_fix.log
git apply bench/wip/packed-amax.patch && bash scripts/device/run.sh $OUT build > $OUT/run_build_pk.txt 2>&1; tail -2 $OUT/run_build_pk.txt
(cd /tmp && timeout 200 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu_pk.xml \
  $R/tests/test_fused_quantize.py > $OUT/pytest_pk.log 2>&1); tail -3 $OUT/pytest_pk.log
