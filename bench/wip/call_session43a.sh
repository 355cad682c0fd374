# Session 43 (~480 s on a fresh machine): main built; the fused quantize bench (new:
# bench/bench_fused_quantize.py, never run on a GPU); then every GPU test (.data carried:
# FP8Linear's forward parameter rename and recipe="auto"'s changes have not run on a GPU).
#   run(command="bash bench/wip/call_session43a.sh", carry=[".whl", ".data"], timeout_s=590)
R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
(cd /tmp && timeout 150 python3 $R/bench/bench_fused_quantize.py --out $OUT > $OUT/bench_fused.log 2>&1)
tail -11 $OUT/bench_fused.log
(cd /tmp && timeout 320 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu.xml $R/tests \
  > $OUT/pytest.log 2>&1); tail -6 $OUT/pytest.log
cd $OUT && tar czf logs.tgz --remove-files *.log run_build.txt
