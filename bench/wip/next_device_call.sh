#!/usr/bin/env bash
# The next device calls, planned in session 39 (no device was lent then): ~7 min of command time (cold),
# then ~2 warm. They check what session 39 changed without a GPU, and the waiting packed-amax patch:
#  - the whole GPU suite (session 39 moved run_split_k into split_k_reduce.h for both GEMM dispatchers,
#    and session 38's resident_wave / fp32 rule never ran on a GPU);
#  - the new subnormal-rows test in test_fused_quantize.py, on main and with packed-amax.patch;
#  - RMSNorm and SwiGLU quantize at 73a5e97 (before sessions 37-38's kernel changes, so their first H200
#    figures), main, and main + packed-amax.patch, in one process each;
#  - per-tensor current scaling (issue 3): the chain tool at main against a variant (none waiting now).
# Here, before the call (about a minute on 2 cores; nothing left in csrc/):
#   bash scripts/device/build_variants.sh rms build/tl rms_old=73a5e97 rms_main=HEAD rms_pk=HEAD+bench/wip/packed-amax.patch
#   bash scripts/device/build_variants.sh silu build/tl silu_old=73a5e97 silu_main=HEAD silu_pk=HEAD+bench/wip/packed-amax.patch
#   bash scripts/device/build_variants.sh chain build/tl chain_main=HEAD chain_pk=HEAD  (amax-partials.patch was
#   dropped in session 41: name another chain variant here, or run "lean" for the suite)
# Calls (the second right after the first, while the machine is warm; each well under 600 s):
#   run(command="bash bench/wip/next_device_call.sh $OUT main", carry=[".whl", ".data", "build/tl"])
#   run(command="bash bench/wip/next_device_call.sh $OUT patch", carry=[".whl", "build/tl"])
# After: ab_summary.py on ab_rms.txt / ab_silu.txt / ab_chain.txt (--json into bench/results/),
# junit_summary.py on gpu.xml, and NOTES. A patch that wins goes on with the steps in its header.
OUT=$1; R=$PWD
if [ "${2:-main}" = patch ]; then
  # The patch's own check: the extension rebuilt with it (incremental when the machine is still warm),
  # then the fused ops' GPU tests, the subnormal rows among them.
  git apply bench/wip/packed-amax.patch && bash scripts/device/run.sh $OUT build > $OUT/run_build_pk.txt 2>&1
  tail -3 $OUT/run_build_pk.txt
  (cd /tmp && timeout 200 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu_pk.xml \
    $R/tests/test_fused_quantize.py > $OUT/pytest_pk.log 2>&1); tail -2 $OUT/pytest_pk.log
  cd $OUT && tar czf logs_pk.tgz --remove-files *.log run_build_pk.txt
  exit 0
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt
# The timings first, on a quiet machine (the build below runs 16 compilers), the versions shuffled.
# "lean" (when device time is short) skips the row-kernel A/Bs: the chain A/B and the whole suite only.
# The chain A/B (issue 3's open question, ~1 min) goes first, in case the machine is taken back mid-call.
for r in 1 2 3; do for b in $(shuf -e build/tl/chain_main build/tl/chain_pk); do
  $b 3 > $OUT/chain_run.txt 2>&1 || echo "FAILED: $(basename $b) round $r: $(grep -v ' us a call' $OUT/chain_run.txt)"
  sed "s/^/$r $(basename $b) /" $OUT/chain_run.txt
done; done > $OUT/ab_chain.txt
grep FAILED $OUT/ab_chain.txt
if [ "${2:-main}" = main ]; then
  bash scripts/device/ab_rows.sh $OUT rms build/tl/rms_old build/tl/rms_main build/tl/rms_pk || echo "rms A/B: FAILED"
  bash scripts/device/ab_rows.sh $OUT silu build/tl/silu_old build/tl/silu_main build/tl/silu_pk || echo "silu A/B: FAILED"
fi
python3 scripts/device/ab_summary.py $OUT/ab_chain.txt --baseline chain_main | tail -7
if [ "${2:-main}" = main ]; then
  python3 scripts/device/ab_summary.py $OUT/ab_rms.txt --baseline rms_main | tail -10
  python3 scripts/device/ab_summary.py $OUT/ab_silu.txt --baseline silu_main | tail -8
fi
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -3 $OUT/run_build.txt
(ctest --test-dir build/device --output-on-failure > $OUT/ctest.log 2>&1; tail -3 $OUT/ctest.log) &
(cd /tmp && timeout 300 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu.xml $R/tests \
  > $OUT/pytest.log 2>&1); tail -4 $OUT/pytest.log
wait
cd $OUT && tar czf logs.tgz --remove-files *.log run_build.txt chain_run.txt
