# Session 50's third call (~560 s; for an H200: the issues' figures are H200 figures): main built
# here unless an earlier call on this machine did; the layer stack against torchao (issue 7), the
# decode suite and the KV write (issue 6), the GEMM quick suite (issue 4), the block-wise GEMM
# (issue 5), the GEMV with whole rotation rounds.
#   run(command="FP8EXT_COMMIT=<sha> CALL_BUDGET=560 bash bench/wip/call_s50c.sh", carry=[".whl", ".data"], timeout_s=580)
source bench/wip/call_lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
python3 -c "import fp8ext" 2>/dev/null || { bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt; }
h200_figures
echo "end at $SECONDS s"
cd $OUT && tar czf logs.tgz --remove-files *.log *.txt logs-*.tgz
