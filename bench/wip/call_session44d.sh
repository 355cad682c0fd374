# Session 44, fourth call (~470 s on a fresh machine). The residual RMSNorm kernel, timeline tool:
# main's copy ("old"), the loads fix alone ("prezf", bench/wip/prezf), the tree ("new": also
# zeros of v kept on quantize_chunk's fast path), the tree with room for 128 registers under
# the residual ("lb": it spills at 64), and prezf on a residual equal to x ("prezf_xcopy": no
# cancellations, so no zeros). The faster of new and lb is kept in the tree here, then built,
# tested (fused + quantize GPU tests) and benchmarked; ncu's DRAM / L2 counters at 16 x 4096.
#   run(command="bash bench/wip/call_session44d.sh", carry=[".whl"], timeout_s=480)
R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
K=csrc/quant/rms_norm_quantize.cu
sed 's/__global__ void __launch_bounds__(kThreads) rms_norm_quantize_kernel/__global__ void __launch_bounds__(kThreads, kAdd ? 1 : 2) rms_norm_quantize_kernel/' $K > csrc/quant/rms_v_lb.cu
cmp -s $K csrc/quant/rms_v_lb.cu && echo "variant lb made no change"
F="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DFP8EXT_WITH_SM90=1 -Icsrc/include -Icsrc"
(nvcc $F scripts/device/rms_timeline.cu -o /tmp/rms_new &
 nvcc $F -DRMS_SOURCE='"../../bench/wip/old_quant/rms_norm_quantize.cu"' scripts/device/rms_timeline.cu -o /tmp/rms_old &
 nvcc $F -DRMS_SOURCE='"../../bench/wip/prezf/rms_norm_quantize.cu"' scripts/device/rms_timeline.cu -o /tmp/rms_prezf &
 nvcc $F -DRMS_SOURCE='"../../csrc/quant/rms_v_lb.cu"' scripts/device/rms_timeline.cu -o /tmp/rms_lb &
 wait) > $OUT/timeline_build.log 2>&1
(for round in 1 2; do
  for shape in "1 4096" "16 4096" "128 4096" "1024 4096" "8192 4096" "16384 4096" "2048 8192"; do
    for v in old prezf new lb; do echo "round $round $v $(timeout 20 /tmp/rms_$v $shape add)"; done
    echo "round $round prezf_xcopy $(RMS_RESIDUAL_COPY_X=1 timeout 20 /tmp/rms_prezf $shape add)"
  done
done) > $OUT/timelines.log 2>&1
python3 - $OUT/timelines.log > $OUT/choice.txt <<'PY'
import math, re, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"round \d+ (\w+) (.*?): ([\d.]+) us a call.*output ([0-9a-f]+)", line)
    if m: rows.setdefault(m.group(2), {}).setdefault(m.group(1), []).append((float(m.group(3)), m.group(4)))
logs = {}
for k, v in rows.items():
    med = {n: st.median(t for t, _ in x) for n, x in v.items()}
    for n in med: logs.setdefault(n, []).append(math.log(med["new"] / med[n]))
    print(k, "  ".join(f"{n} {med[n]:.3f}{'' if n.endswith('xcopy') or {h for _, h in x} == {h for _, h in v['old']} else '*'}" for n, x in v.items()))
g = {n: math.exp(sum(x) / len(x)) for n, x in logs.items()}
print("geomean of new's time over each:", "  ".join(f"{n} {x:.4f}" for n, x in g.items()))
best = max(("new", "lb"), key=lambda n: g[n])
print(f"keep {best}")
PY
cat $OUT/choice.txt
KEEP=$(tail -1 $OUT/choice.txt | cut -d' ' -f2)
[ "$KEEP" != new ] && cp csrc/quant/rms_v_$KEEP.cu $K
rm -f csrc/quant/rms_v_*.cu
/usr/local/cuda/bin/ncu --cache-control none --clock-control none -k regex:rms_norm_quantize_kernel -s 40 -c 2 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum \
  /tmp/rms_prezf 16 4096 add > $OUT/ncu_add.log 2>&1
grep -E "duration|dram__|lts__" $OUT/ncu_add.log | tail -5
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
(cd /tmp && timeout 150 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu_quant.xml \
  $R/tests/test_fused_quantize.py $R/tests/test_quantize_cuda.py -k "not test_quantize_cuda.py or matches_cpu or graph" \
  > $OUT/pytest.log 2>&1); tail -2 $OUT/pytest.log
(cd /tmp && timeout 100 python3 $R/bench/bench_fused_quantize.py --out $OUT > $OUT/bench_fused.log 2>&1)
tail -11 $OUT/bench_fused.log
cd $OUT && tar czf logs.tgz --remove-files *.log run_build.txt
