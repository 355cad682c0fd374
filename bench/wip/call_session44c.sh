# Session 44, third call (~200 s on a fresh machine): the residual RMSNorm kernel's loads,
# streaming (main) against default caching for the residual or for every operand, and
# main's copy (bench/wip/old_quant), in the timeline tool; then the Triton code inductor
# writes for the same op (the anchor that is 30% faster).
#   run(command="bash bench/wip/call_session44c.sh", carry=[".whl"], timeout_s=400)
R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
K=csrc/quant/rms_norm_quantize.cu
sed 's/issue_row_chunks(add.residual, r,/issue_row_chunks<false>(add.residual, r,/' $K > csrc/quant/rms_v_rescached.cu
sed 's/issue_row_chunks(add.residual, r,/issue_row_chunks<false>(add.residual, r,/; s/issue_row_chunks(in, r,/issue_row_chunks<false>(in, r,/; s/issue_row_chunks(weight, 0,/issue_row_chunks<false>(weight, 0,/' $K > csrc/quant/rms_v_allcached.cu
for v in rescached allcached; do cmp -s $K csrc/quant/rms_v_$v.cu && echo "variant $v made no change"; done
F="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DFP8EXT_WITH_SM90=1 -Icsrc/include -Icsrc"
(nvcc $F scripts/device/rms_timeline.cu -o /tmp/rms_new &
 nvcc $F -DRMS_SOURCE='"../../bench/wip/old_quant/rms_norm_quantize.cu"' scripts/device/rms_timeline.cu -o /tmp/rms_old &
 for v in rescached allcached; do
   nvcc $F -DRMS_SOURCE="\"../../csrc/quant/rms_v_$v.cu\"" scripts/device/rms_timeline.cu -o /tmp/rms_$v &
 done; wait) > $OUT/timeline_build.log 2>&1
(for round in 1 2 3; do
  for shape in "1 4096" "16 4096" "128 4096" "1024 4096" "8192 4096" "16384 4096" "16 8192" "2048 8192"; do
    for v in old new rescached allcached; do echo "round $round $v $(timeout 20 /tmp/rms_$v $shape add)"; done
  done
done) > $OUT/timelines.log 2>&1
python3 - $OUT/timelines.log <<'PY'
import re, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"round \d+ (\w+) (.*?): ([\d.]+) us a call.*output ([0-9a-f]+)", line)
    if m: rows.setdefault(m.group(2), {}).setdefault(m.group(1), []).append((float(m.group(3)), m.group(4)))
for k, v in rows.items():
    print(k, "  ".join(f"{n} {st.median(t for t, _ in x):.3f}{'' if {h for _, h in x} == {h for _, h in v['old']} else '*'}"
                       for n, x in v.items()))
PY
rm -f csrc/quant/rms_v_*.cu
(timeout 120 python3 bench/wip/inductor_add_rms_code.py > $OUT/inductor_code.txt 2>&1); grep -n "eviction_policy\|num_warps\|def triton\|RBLOCK\|XBLOCK\|R0_BLOCK" $OUT/inductor_code.txt | head -40
cd $OUT && tar czf logs.tgz --remove-files *.log
