# Session 46's second call (~300 s): the padded copy reworked (a thread per 16-byte chunk of dst,
# load and store widths chosen apart, two chunks in flight per thread; scale vectors padded by it
# too): built; its harness test and the GEMM harnesses; the GPU tests of every path through it
# (unaligned, strided, offset, padded-by-hand bit-exact, block-wise unaligned, split-K, GEMV, and
# helper-38's PDL chain through the padded path);
# then the padded path timed against the path it replaced and the aligned shape.
#   run(command="CALL_BUDGET=280 bash bench/wip/call_session46b.sh", carry=[".whl"], timeout_s=300)
R=$PWD
B=${CALL_BUDGET:-330}
left() { echo $((B - SECONDS)); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
(timeout 60 ctest --test-dir $R/build/device -R "padded|scaled_mm|blockwise" --output-on-failure > $OUT/ctest.log 2>&1; \
  echo "ctest rc $?"; grep -E "tests passed|Failed|\*\*\*" $OUT/ctest.log | tail -4)
(timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 \
  $R/build/device/csrc/tests/fp8ext_test_padded_copy_cuda > $OUT/memcheck.log 2>&1; echo "memcheck rc $?"; tail -3 $OUT/memcheck.log)
(cd /tmp && timeout $(( $(left) - 60 )) python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu.xml \
  $R/tests/test_scaled_mm_cuda.py $R/tests/test_scaled_mm_blockwise_cuda.py $R/tests/test_pdl_cuda.py \
  -k "padded or unaligned or strided or offset or gemv or split or bias or empty" > $OUT/pytest.log 2>&1; echo "pytest rc $?"); tail -3 $OUT/pytest.log
[ $(left) -gt 40 ] && (cd /tmp && timeout $(( $(left) - 10 )) python3 $R/scripts/device/time_padded_path.py --out $OUT \
  > $OUT/padded.log 2>&1; tail -6 $OUT/padded.log)
echo "end at $SECONDS s"
cd $OUT && tar czf logs.tgz --remove-files *.log *.txt logs-*.tgz
