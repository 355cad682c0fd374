# Session 43, last call (~400 s on a fresh machine): the final RMSNorm ring rule (a4144f7) built;
# the quantize harness, pytest -m gpu on test_fused_quantize, and the fused quantize bench.
#   run(command="bash bench/wip/call_session43c.sh", carry=[".whl"], timeout_s=470)
R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
(timeout 60 build/device/csrc/tests/fp8ext_test_quantize_cuda > $OUT/harness.log 2>&1; echo "harness rc=$?"; tail -1 $OUT/harness.log)
(cd /tmp && timeout 120 python3 $R/bench/bench_fused_quantize.py --out $OUT > $OUT/bench_fused.log 2>&1)
tail -11 $OUT/bench_fused.log
(cd /tmp && timeout 130 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu.xml \
  $R/tests/test_fused_quantize.py > $OUT/pytest.log 2>&1); tail -2 $OUT/pytest.log
cd $OUT && tar czf logs.tgz --remove-files *.log run_build.txt
