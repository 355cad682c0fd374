# Session 42, for an H200 only (~320 s): issue 3's figure with the zero-free amax slots: main built,
# then bench_quantize and the zero-free A/B. On any other GPU it stops at once.
#   run(command="bash bench/wip/call_session42d.sh", carry=[".whl"], timeout_s=450)
R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt
grep -q H200 $OUT/gpu0.txt || { echo "not an H200: nothing run"; cat $OUT/gpu0.txt; exit 0; }
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
(cd /tmp && timeout 130 python3 $R/bench/bench_quantize.py --out $OUT > $OUT/bench_quantize.log 2>&1); tail -14 $OUT/bench_quantize.log
(cd /tmp && timeout 100 python3 $R/scripts/device/ab_quant_env.py --cases per_tensor_current static \
  --settings - FP8EXT_QUANT_ZERO_FREE=0 --rounds 5 --out $OUT > $OUT/ab.log 2>&1); tail -4 $OUT/ab.log
cd $OUT && tar czf logs.tgz --remove-files *.log run_build.txt
