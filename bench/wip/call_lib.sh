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
