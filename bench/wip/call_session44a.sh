# Session 44, first call (~450 s on a fresh machine; an H200 preferred for the figures):
# the two-phase loads of the fused quantizers (issue every operand's load, then
# finish) against main's copies in bench/wip/old_quant (timeline tools, no torch
# build), then main built, the fused and quantize GPU tests and both quantize benches.
#   run(command="bash bench/wip/call_session44a.sh", carry=[".whl"], timeout_s=580)
R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
F="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DFP8EXT_WITH_SM90=1 -Icsrc/include -Icsrc"
OLD='"../../bench/wip/old_quant'
(nvcc $F scripts/device/rms_timeline.cu -o /tmp/rms_new &
 nvcc $F -DRMS_SOURCE="$OLD/rms_norm_quantize.cu\"" scripts/device/rms_timeline.cu -o /tmp/rms_old &
 nvcc $F scripts/device/silu_timeline.cu -o /tmp/silu_new &
 nvcc $F -DSILU_SOURCE="$OLD/silu_mul_quantize.cu\"" scripts/device/silu_timeline.cu -o /tmp/silu_old &
 wait) > $OUT/timeline_build.log 2>&1
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
# Timelines after the build (no CPU contention): 3 rounds, old/new order alternating.
(for round in 1 2 3; do
  for shape in "1 4096" "16 4096" "128 4096" "1024 4096" "8192 4096" "16384 4096" "1 8192" "16 8192" "2048 8192"; do
    for mode in plain add; do
      if [ $((round % 2)) = 1 ]; then order="old new"; else order="new old"; fi
      for v in $order; do echo "round $round $v $(timeout 20 /tmp/rms_$v $shape $mode)"; done
    done
  done
  for shape in "1 14336" "16 14336" "128 14336" "1024 14336" "8192 14336"; do
    for v in old new; do echo "round $round $v silu $(timeout 20 /tmp/silu_$v $shape)"; done
  done
done) > $OUT/timelines.txt 2>&1
python3 - $OUT/timelines.txt <<'EOF'
import re, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"round \d+ (old|new) (?:silu )?(.*?): ([\d.]+) us a call.*output ([0-9a-f]+)", line)
    if m: rows.setdefault(m.group(2), {}).setdefault(m.group(1), []).append((float(m.group(3)), m.group(4)))
for k, v in rows.items():
    o, n = v.get("old", []), v.get("new", [])
    same = {h for _, h in o} == {h for _, h in n}
    if o and n:
        print(f"{k:40s} old {st.median(t for t, _ in o):8.3f} new {st.median(t for t, _ in n):8.3f} "
              f"ratio {st.median(t for t, _ in o) / st.median(t for t, _ in n):.3f} {'same bits' if same else 'BITS DIFFER'}")
EOF
(cd /tmp && timeout 150 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu_quant.xml \
  $R/tests/test_fused_quantize.py $R/tests/test_quantize_cuda.py > $OUT/pytest.log 2>&1); tail -2 $OUT/pytest.log
(cd /tmp && timeout 120 python3 $R/bench/bench_fused_quantize.py --out $OUT > $OUT/bench_fused.log 2>&1)
tail -11 $OUT/bench_fused.log
(cd /tmp && timeout 120 python3 $R/bench/bench_quantize.py --out $OUT > $OUT/bench_quantize.log 2>&1)
tail -14 $OUT/bench_quantize.log
cd $OUT && tar czf logs.tgz --remove-files *.log run_build.txt
