# Session 52's whole-suite call (~560 s; for a day when starts fail and one call must do): main
# built; the whole GPU suite in one pytest (session 51: ~355 s in two parts on an H100); then the
# rotated decode suite and the layer stack with what is left. ctest is not owed: the C++ harnesses
# passed at 8ec6073 (all) and 08ad5b2 (the GEMM and paged ones after the last csrc change).
#   run(command="FP8EXT_COMMIT=<sha> CALL_BUDGET=560 bash bench/wip/call_s52b.sh", carry=[".whl", ".data"], timeout_s=580)
source bench/wip/call_lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
python3 -c "import fp8ext" 2>/dev/null || { bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt; }
echo "built at $SECONDS s"
(cd /tmp && timeout $(( $(left) - 15 )) python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/all.xml \
  $R/tests > $OUT/pytest.log 2>&1; echo "pytest rc $? at $SECONDS s"); tail -4 $OUT/pytest.log
bench decode 80 python3 $R/bench/bench_decode.py --out $OUT
bench linear 90 python3 $R/bench/bench_linear.py --out $OUT
echo "end at $SECONDS s"
cd $OUT && tar czf logs.tgz --remove-files *.log *.txt logs-*.tgz
