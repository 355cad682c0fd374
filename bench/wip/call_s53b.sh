# Session 53's last call (~280 s, an H200 only: the issues' figures are H200 figures): main built;
# the layer stack against torchao (issue 7), then the decode suite and KV write (issue 6) if time
# is left.
#   run(command="FP8EXT_COMMIT=<sha> CALL_BUDGET=280 bash bench/wip/call_s53b.sh", carry=[".whl", ".data"], needs_h200=true)
source bench/wip/call_lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
python3 -c "import fp8ext" 2>/dev/null || { bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt; }
echo "built at $SECONDS s"
bench linear 80 python3 $R/bench/bench_linear.py --out $OUT --no-breakdown
bench decode 60 python3 $R/bench/bench_decode.py --out $OUT
echo "end at $SECONDS s"
cd $OUT && tar czf logs.tgz --remove-files *.log *.txt
