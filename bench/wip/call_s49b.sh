# Session 49's second call (~470 s; after call_s49a.sh, which runs the tests on main): the A/B of
# kv-write-loads-first.patch. main built; the KV write bench from DRAM on main (JSON); the patch built
# beside main into /tmp/kvl (pip install --target), its KV tests, and the write bench in alternating
# processes main / kvl / kvl / main (logs only).
#   run(command="FP8EXT_COMMIT=<sha> CALL_BUDGET=560 bash bench/wip/call_s49b.sh", carry=[".whl", ".data"], timeout_s=580)
R=$PWD
B=${CALL_BUDGET:-560}
left() { echo $((B - SECONDS)); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
KV_TESTS="$R/tests/test_kv_cache_cuda.py $R/tests/test_rotary_kv_write.py $R/tests/test_serving.py"
[ $(left) -gt 40 ] && (cd /tmp && timeout 45 python3 $R/bench/bench_decode.py --writes-only --out $OUT \
  > $OUT/bench_write_main0.log 2>&1; tail -5 $OUT/bench_write_main0.log)
if [ $(left) -gt 170 ]; then
  for c in /usr/bin/g++ /usr/bin/g++-14 /usr/bin/g++-13 /usr/bin/g++-12; do
    if [ -x "$c" ]; then export CXX="$c" CUDAHOSTCXX="$c"; break; fi
  done
  git apply bench/wip/kv-write-loads-first.patch && \
  (CUTLASS_DIR=/tmp/site/cutlass_library/source CUDA_HOME=/usr/local/cuda FP8EXT_BUILD_DIR=$R/build/device MAX_JOBS=16 \
    timeout 100 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/kvl . > $OUT/kvl_build.log 2>&1; \
    echo "kvl build rc $?"; tail -3 $OUT/kvl_build.log)
  git apply -R bench/wip/kv-write-loads-first.patch
  (cd /tmp && PYTHONPATH=/tmp/kvl timeout 40 python3 -m pytest -q -p no:cacheprovider -m gpu --junitxml=$OUT/gpu_kvl.xml \
    $KV_TESTS > $OUT/pytest_kvl.log 2>&1; echo "kvl pytest rc $?"; tail -2 $OUT/pytest_kvl.log)
  (cd /tmp && i=0; for v in main kvl kvl main; do
    i=$((i + 1)); if [ $v = kvl ]; then P=/tmp/kvl; else P=; fi
    [ $(left) -gt 40 ] && PYTHONPATH=$P timeout 40 python3 $R/bench/bench_decode.py --writes-only --out /tmp/w_$i \
      > $OUT/bench_write_${i}_$v.log 2>&1 && echo "$v:" && grep -E "^ *[0-9]" $OUT/bench_write_${i}_$v.log
  done)
fi
echo "end at $SECONDS s"
cd $OUT && tar czf logs.tgz --remove-files *.log *.txt logs-*.tgz
