# Session 46's last call (~200 s of device time left): the padded copy with two kernels (the chunk
# kernel for 16-byte-aligned dst rows, the row kernel for narrower ones: D's columns dropped);
# built; the copy's harness under memcheck (every byte of every case); the padded path's GPU tests;
# then the padded path timed (rows printed as they come).
#   run(command="CALL_BUDGET=190 bash bench/wip/call_session46c.sh", carry=[".whl"], timeout_s=200)
R=$PWD
B=${CALL_BUDGET:-190}
left() { echo $((B - SECONDS)); }
nvidia-smi --query-gpu=name --format=csv,noheader
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -1 $OUT/run_build.txt
(timeout 25 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 \
  $R/build/device/csrc/tests/fp8ext_test_padded_copy_cuda > $OUT/memcheck.log 2>&1; echo "memcheck rc $?"; tail -2 $OUT/memcheck.log)
(cd /tmp && timeout 30 python3 -m pytest -q -p no:cacheprovider -m gpu --junitxml=$OUT/gpu.xml \
  $R/tests/test_scaled_mm_cuda.py $R/tests/test_scaled_mm_blockwise_cuda.py $R/tests/test_pdl_cuda.py \
  -k "padded or unaligned or strided" > $OUT/pytest.log 2>&1; echo "pytest rc $?"); tail -1 $OUT/pytest.log
[ $(left) -gt 20 ] && (cd /tmp && timeout $(( $(left) - 4 )) python3 $R/scripts/device/time_padded_path.py --rounds 4 \
  --out $OUT > $OUT/padded.log 2>&1; tail -5 $OUT/padded.log)
echo "end at $SECONDS s"
cd $OUT && tar czf logs.tgz --remove-files *.log *.txt logs-*.tgz
