# Session 42's last call (~550 s): main built, then on an H200 bench_quantize first (issue 3's figure,
# on a quiet machine), then ctest and the whole GPU suite (the zero-free amax slots are now the default
# for every eager per-tensor current call: FP8Linear, serving, calibration use it).
#   run(command="bash bench/wip/call_session42c.sh", carry=[".whl", ".data"], timeout_s=590)
R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
if grep -q H200 $OUT/gpu0.txt; then
  (cd /tmp && PYTHONPATH=/tmp/site timeout 130 python3 $R/bench/bench_quantize.py --out $OUT > $OUT/bench_quantize.log 2>&1)
  tail -14 $OUT/bench_quantize.log
fi
(ctest --test-dir build/device --output-on-failure > $OUT/ctest.log 2>&1; tail -3 $OUT/ctest.log) &
(cd /tmp && timeout 260 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu.xml $R/tests \
  > $OUT/pytest.log 2>&1); tail -4 $OUT/pytest.log
wait
cd $OUT && tar czf logs.tgz --remove-files *.log run_build.txt
