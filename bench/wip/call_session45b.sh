# Session 45's call (device starts were scarce: one call had to prove the tree): main built;
# the paged-KV and block-wise C++ harnesses; every GPU test (pytest -m gpu tests/: the fused
# quantize file with its never-run SwiGLU bit-exact test, the kept-pass fence, the KV refusals
# and the all -inf head, the block-wise PDL wait); then zeros-fast-everywhere.patch built
# incrementally into /tmp/zf, timed against main in alternating processes on inputs with and
# without zeros, and its bit-exact test; the fused quantize bench if time is left.
#   run(command="CALL_BUDGET=590 bash bench/wip/call_session45b.sh", carry=[".whl", ".data"], timeout_s=590)
R=$PWD
B=${CALL_BUDGET:-590}  # the call's timeout_s: later steps are skipped or cut to fit
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu0.txt; cat $OUT/gpu0.txt
bash scripts/device/run.sh $OUT build > $OUT/run_build.txt 2>&1; tail -2 $OUT/run_build.txt
(ctest --test-dir $R/build/device -R "paged|blockwise" --output-on-failure > $OUT/ctest.log 2>&1; echo "ctest rc $?"; grep -E "tests passed|Failed|Passed" $OUT/ctest.log | tail -4)
(cd /tmp && timeout $((B - 90 - SECONDS)) python3 -m pytest -q -rs -p no:cacheprovider -m gpu --junitxml=$OUT/gpu_all.xml \
  $R/tests > $OUT/pytest_all.log 2>&1; echo "pytest rc $?"); tail -4 $OUT/pytest_all.log
for c in /usr/bin/g++ /usr/bin/g++-14 /usr/bin/g++-13 /usr/bin/g++-12; do
  if [ -x "$c" ]; then export CXX="$c" CUDAHOSTCXX="$c"; break; fi
done
if [ $SECONDS -lt $((B - 140)) ]; then
  git apply bench/wip/zeros-fast-everywhere.patch && \
  (CUTLASS_DIR=/tmp/site/cutlass_library/source CUDA_HOME=/usr/local/cuda FP8EXT_BUILD_DIR=$R/build/device MAX_JOBS=16 \
    timeout 100 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/zf . > $OUT/zf_build.log 2>&1; \
    echo "zf build rc $?"; tail -3 $OUT/zf_build.log)
  git apply -R bench/wip/zeros-fast-everywhere.patch
  (cd /tmp && for v in main zf zf main; do
    if [ $v = zf ]; then P=/tmp/zf; else P=; fi
    [ $SECONDS -lt $((B - 50)) ] && PYTHONPATH=$P timeout 30 python3 $R/scripts/device/time_quant_inputs.py --label $v \
      --out $OUT/zeros_ab.jsonl > /dev/null 2>> $OUT/zeros_ab.log
  done)
  python3 - $OUT/zeros_ab.jsonl <<'PY'
import json, sys, statistics as st, collections
d = collections.defaultdict(lambda: collections.defaultdict(list)); h = collections.defaultdict(set)
for line in open(sys.argv[1]):
    r = json.loads(line); d[(r["input"], r["op"])][r["label"]].append(r["us"]); h[(r["input"], r["op"])].add(r["codes_sha1"])
for k, v in d.items():
    if v["main"] and v["zf"]:
        m, z = st.median(v["main"]), st.median(v["zf"])
        print(f"{k[0]:12s} {k[1]:20s} main {m:9.2f} zf {z:9.2f} main/zf {m / z:.3f} {'same codes' if len(h[k]) == 1 else 'CODES DIFFER'}")
PY
  [ $SECONDS -lt $((B - 60)) ] && (cd /tmp && PYTHONPATH=/tmp/zf timeout $((B - 15 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -m gpu \
    --junitxml=$OUT/gpu_zf.xml $R/tests/test_quantize_cuda.py -k "cuda_matches_cpu" > $OUT/pytest_zf.log 2>&1; \
    echo "zf pytest rc $?"; tail -2 $OUT/pytest_zf.log)
fi
[ $SECONDS -lt $((B - 110)) ] && (cd /tmp && timeout $((B - 15 - SECONDS)) python3 $R/bench/bench_fused_quantize.py --out $OUT > $OUT/bench_fused.log 2>&1; tail -11 $OUT/bench_fused.log)
cd $OUT && tar czf logs.tgz --remove-files *.log *.txt *.xml *.jsonl logs-*.tgz
