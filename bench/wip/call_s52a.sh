# Session 52's first call (~560 s): main built; the first part of the whole GPU suite (the five
# files session 51 ran first: quantize, fakes, KV cache, rotary write, two devices); every C++
# harness; then the rotated decode suite (issue 6) and the layer stack (issue 7) with what is left.
# The rest of the suite goes in a second call on the same warm machine (bench/wip/README.md).
#   run(command="FP8EXT_COMMIT=<sha> CALL_BUDGET=560 bash bench/wip/call_s52a.sh", carry=[".whl", ".data"], timeout_s=580)
R=$PWD
B=${CALL_BUDGET:-560}
left() { echo $((B - SECONDS)); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
python3 -c "import fp8ext" 2>/dev/null || { bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt; }
echo "built at $SECONDS s"
(cd /tmp && timeout $(( $(left) - 60 )) python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/first.xml \
  $R/tests/test_quantize_cuda.py $R/tests/test_fake_checks.py $R/tests/test_kv_cache_cuda.py $R/tests/test_rotary_kv_write.py \
  $R/tests/test_two_devices_cuda.py > $OUT/pytest.log 2>&1; echo "pytest rc $? at $SECONDS s"); tail -4 $OUT/pytest.log
[ $(left) -gt 100 ] && (timeout $(( $(left) > 200 ? 160 : $(left) - 50 )) ctest --test-dir $R/build/device \
  --output-on-failure > $OUT/ctest.log 2>&1; echo "ctest rc $? at $SECONDS s"; grep -E "tests passed|Failed|\*\*\*|Passed" $OUT/ctest.log | tail -10)
bench() {  # bench NAME SECONDS CMD...: runs CMD in /tmp if that many seconds are left, log to OUT/NAME.log
  local name=$1 need=$2; shift 2
  if [ $(left) -gt $need ]; then
    (cd /tmp && PYTHONPATH=/tmp/site timeout $(( $(left) - 10 )) "$@" > $OUT/$name.log 2>&1; echo "$name rc $? at $SECONDS s")
    tail -14 $OUT/$name.log
  fi
}
bench decode 80 python3 $R/bench/bench_decode.py --out $OUT
bench linear 90 python3 $R/bench/bench_linear.py --out $OUT
echo "end at $SECONDS s"
cd $OUT && tar czf logs.tgz --remove-files *.log *.txt logs-*.tgz
