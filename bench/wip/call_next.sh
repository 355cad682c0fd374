# Waiting (written in session 43, ~420 s on a fresh machine; any GPU, an H200 preferred for the
# figures): main built; the C++ harness (the quantize one runs both RMSNorm kernels); pytest -m gpu
# on test_fused_quantize (the ring kernel's bit-equality and graph tests have not run on the final
# tree: bench/NOTES.md session 43); the RMSNorm ring A/B and the fused quantize bench.
#   run(command="bash bench/wip/call_next.sh", carry=[".whl"], timeout_s=560)
R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
(timeout 120 build/device/csrc/tests/fp8ext_test_quantize_cuda > $OUT/harness.log 2>&1; echo "harness rc=$?"; tail -1 $OUT/harness.log)
(cd /tmp && timeout 150 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu.xml \
  $R/tests/test_fused_quantize.py > $OUT/pytest.log 2>&1); tail -2 $OUT/pytest.log
(cd /tmp && timeout 100 python3 $R/scripts/device/ab_quant_env.py --cases rms_norm add_rms_norm \
  --shapes 1024x4096 8192x4096 16384x4096 2048x8192 8192x8192 \
  --settings FP8EXT_RMS_RING=0 FP8EXT_RMS_RING=1 --rounds 3 --out $OUT > $OUT/ab.log 2>&1); tail -20 $OUT/ab.log
(cd /tmp && timeout 120 python3 $R/bench/bench_fused_quantize.py --out $OUT > $OUT/bench_fused.log 2>&1)
tail -11 $OUT/bench_fused.log
cd $OUT && tar czf logs.tgz --remove-files *.log run_build.txt
