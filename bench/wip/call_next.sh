# Waiting (written in session 44, ~400 s on a fresh machine; an H200 wanted for the figures, which
# so far are H100 only): main built; pytest -m gpu on the fused quantize file; the fused quantize
# bench and the RMSNorm ring A/B (FP8EXT_RMS_RING) on the final kernels (session 44's zero path and
# register room changed the one-row residual kernel that the ring rule was tuned against).
#   run(command="bash bench/wip/call_next.sh", carry=[".whl"], timeout_s=560)
R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
(cd /tmp && timeout 150 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu.xml \
  $R/tests/test_fused_quantize.py > $OUT/pytest.log 2>&1); tail -2 $OUT/pytest.log
(cd /tmp && timeout 120 python3 $R/bench/bench_fused_quantize.py --out $OUT > $OUT/bench_fused.log 2>&1)
tail -11 $OUT/bench_fused.log
(cd /tmp && timeout 100 python3 $R/scripts/device/ab_quant_env.py --cases rms_norm add_rms_norm \
  --shapes 1024x4096 8192x4096 16384x4096 2048x8192 8192x8192 \
  --settings FP8EXT_RMS_RING=0 FP8EXT_RMS_RING=1 --rounds 3 --out $OUT > $OUT/ab.log 2>&1); tail -20 $OUT/ab.log
cd $OUT && tar czf logs.tgz --remove-files *.log run_build.txt
