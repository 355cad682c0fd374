# Session 44, second call (~420 s; on the warm machine of call a, or fresh): diagnostics of
# the residual RMSNorm kernel's extra cost (variants made here by sed from the tree's kernel:
# no h store; the residual's loads aimed at x; the finish halves out of line = 85 registers),
# against main's copy in bench/wip/old_quant; then ctest and every GPU test.
#   run(command="bash bench/wip/call_session44b.sh", carry=[".whl", ".data"], timeout_s=590)
R=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
K=csrc/quant/rms_norm_quantize.cu
sed 's/^    if (own < read_chunks) add.store(r, own \* kChunk, a);$/    ;/' $K > csrc/quant/rms_v_nostore.cu
sed 's/issue_row_chunks(add.residual, r,/issue_row_chunks(in, r,/; s/finish_row_chunks<false>(add.residual, r,/finish_row_chunks<false>(in, r,/' $K > csrc/quant/rms_v_resx.cu
sed 's/finish_row_chunks<false>/finish_row_chunks<true>/g' $K > csrc/quant/rms_v_compact.cu
for v in nostore resx compact; do cmp -s $K csrc/quant/rms_v_$v.cu && echo "variant $v made no change"; done
F="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DFP8EXT_WITH_SM90=1 -Icsrc/include -Icsrc"
(nvcc $F scripts/device/rms_timeline.cu -o /tmp/rms_new &
 nvcc $F -DRMS_SOURCE='"../../bench/wip/old_quant/rms_norm_quantize.cu"' scripts/device/rms_timeline.cu -o /tmp/rms_old &
 for v in nostore resx compact; do
   nvcc $F -DRMS_SOURCE="\"../../csrc/quant/rms_v_$v.cu\"" scripts/device/rms_timeline.cu -o /tmp/rms_$v &
 done; wait) > $OUT/timeline_build.log 2>&1
[ -f build/device/csrc/tests/fp8ext_test_quantize_cuda ] || { bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt; }
(for round in 1 2 3; do
  for shape in "1 4096" "16 4096" "1024 4096" "8192 4096" "16384 4096"; do
    for v in old new nostore resx compact; do echo "round $round $v $(timeout 20 /tmp/rms_$v $shape add)"; done
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
# ctest beside every GPU-marked test (correctness only: nothing is timed from here on)
(timeout 250 ctest --test-dir build/device --output-on-failure > $OUT/ctest.log 2>&1; echo "ctest rc=$?") &
(cd /tmp && timeout 300 python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu_all.xml \
  $R/tests > $OUT/pytest_all.log 2>&1); wait; tail -3 $OUT/ctest.log; tail -4 $OUT/pytest_all.log
rm -f csrc/quant/rms_v_*.cu
cd $OUT && tar czf logs.tgz --remove-files *.log run_*.txt
