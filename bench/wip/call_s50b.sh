# Session 50's second call (~560 s; main built by run.sh here or by an earlier call on the same
# machine): the A/Bs of bench/wip's two waiting patches. Each is built incrementally in main's
# build folder into its own --target (kv-write-loads-first -> /tmp/kvl, padded-copy-narrow-rows ->
# /tmp/pad), its GPU tests run on it, then the bench on main and the patch in alternating processes.
#   run(command="FP8EXT_COMMIT=<sha> CALL_BUDGET=560 bash bench/wip/call_s50b.sh", carry=[".whl", ".data"], timeout_s=580)
# (Both patches were measured and rejected in session 50; they are at 963046f. As a template: change the names.)
R=$PWD
B=${CALL_BUDGET:-560}
left() { echo $((B - SECONDS)); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
python3 -c "import fp8ext" 2>/dev/null || { bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt; }
for c in /usr/bin/g++ /usr/bin/g++-14 /usr/bin/g++-13 /usr/bin/g++-12; do
  if [ -x "$c" ]; then export CXX="$c" CUDAHOSTCXX="$c"; break; fi
done
build_patch() {  # build_patch NAME TARGET: main + bench/wip/NAME.patch installed into TARGET
  git apply bench/wip/$1.patch && \
  (CUTLASS_DIR=/tmp/site/cutlass_library/source CUDA_HOME=/usr/local/cuda FP8EXT_BUILD_DIR=$R/build/device MAX_JOBS=16 \
    timeout 150 python3 -m pip install -q --no-build-isolation --no-deps --target $2 . > $OUT/build_$1.log 2>&1; \
    echo "$1 build rc $? at $SECONDS s"; tail -3 $OUT/build_$1.log)
  git apply -R bench/wip/$1.patch
}
build_patch kv-write-loads-first /tmp/kvl
(cd /tmp && PYTHONPATH=/tmp/kvl timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu --junitxml=$OUT/gpu_kvl.xml \
  $R/tests/test_kv_cache_cuda.py $R/tests/test_rotary_kv_write.py > $OUT/pytest_kvl.log 2>&1; echo "kvl pytest rc $?"; tail -2 $OUT/pytest_kvl.log)
(cd /tmp && i=0; for v in main kvl kvl main; do
  i=$((i + 1)); if [ $v = kvl ]; then P=/tmp/kvl; else P=; fi
  [ $(left) -gt 200 ] && PYTHONPATH=$P timeout 40 python3 $R/bench/bench_decode.py --writes-only --out /tmp/w_$i \
    > $OUT/bench_write_${i}_$v.log 2>&1 && echo "$v:" && grep -E "^ *[0-9]" $OUT/bench_write_${i}_$v.log
done)
if [ $(left) -gt 220 ]; then
  build_patch padded-copy-narrow-rows /tmp/pad
  # The harness in build/device is the patched one now.
  (timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 1 \
    $R/build/device/csrc/tests/fp8ext_test_padded_copy_cuda > $OUT/memcheck_pad.log 2>&1; echo "pad memcheck rc $?"; tail -3 $OUT/memcheck_pad.log)
  (cd /tmp && PYTHONPATH=/tmp/pad timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu -k "padded or unaligned" \
    --junitxml=$OUT/gpu_pad.xml $R/tests > $OUT/pytest_pad.log 2>&1; echo "pad pytest rc $?"; tail -2 $OUT/pytest_pad.log)
  (cd /tmp && i=0; for v in main pad pad main; do
    i=$((i + 1)); if [ $v = pad ]; then P=/tmp/pad; else P=; fi
    [ $(left) -gt 40 ] && PYTHONPATH=$P timeout 60 python3 $R/scripts/device/time_padded_path.py --rounds 4 --out /tmp/p_$i \
      > $OUT/padded_${i}_$v.log 2>&1 && echo "$v:" && cat $OUT/padded_${i}_$v.log | grep " new "
  done)
fi
echo "end at $SECONDS s"
cd $OUT && tar czf logs.tgz --remove-files *.log *.txt logs-*.tgz
