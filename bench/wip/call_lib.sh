# Shared by the call scripts (source it first): R, the repo; left, the seconds left of
# CALL_BUDGET; bench NAME SECONDS CMD..., which runs CMD in /tmp (the carried wheels on
# PYTHONPATH) if that many seconds are left, logging to $OUT/NAME.log.
R=$PWD
B=${CALL_BUDGET:-560}
left() { echo $((B - SECONDS)); }
bench() {
  local name=$1 need=$2; shift 2
  if [ $(left) -gt $need ]; then
    (cd /tmp && PYTHONPATH=/tmp/site timeout $(( $(left) - 10 )) "$@" > $OUT/$name.log 2>&1; echo "$name rc $? at $SECONDS s")
    tail -14 $OUT/$name.log
  fi
}
# The issues' figures, for a call on an H200 (the targets are H200 figures): the layer stack
# against torchao (issue 7), decode + KV write (6), the GEMM quick suite (4), block-wise (5), the GEMV.
h200_figures() {
  bench linear 90 python3 $R/bench/bench_linear.py --out $OUT
  bench decode 90 python3 $R/bench/bench_decode.py --out $OUT
  bench gemm 90 python3 $R/bench/bench_gemm.py --out $OUT
  bench blockwise 90 python3 $R/bench/bench_gemm_blockwise.py --out $OUT
  bench gemv 40 python3 $R/scripts/device/time_gemv.py --out $OUT
}
