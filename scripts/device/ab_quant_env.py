"""One process, bf16 inputs (bench_quantize's 16384x8192 unless --shapes): the
row-striding quantize kernels timed (benchlib.time_ms) under each value of one environment
variable that the library reads at launch, interleaved over rounds, with the
codes checked equal across values.

    python3 scripts/device/ab_quant_env.py --var FP8EXT_PDL --settings 1 0 [--rounds 3] [--shapes MxK ...] [--out DIR]

Without --var, each setting is a comma-separated list of VAR=VALUE ("-" for
none); every variable named in any setting is unset before each setting.

(The knobs it timed are constants now: FP8EXT_QUANT_BLOCKS_PER_SM (session 13) and
FP8EXT_QUANT_BPS, _BPS_AMAX, _FORWARD (session 14) in quant_common.cuh and quantize_per_tensor.cu.)
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from benchlib import apply_env, env_setting, time_ms, write_record  # noqa: E402

import fp8ext  # noqa: E402,F401

F8 = torch.float8_e4m3fn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--var")
    ap.add_argument("--settings", nargs="+", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", nargs="+",
                    help="a subset of: static delayed per_tensor_current group_1x128 rms_norm add_rms_norm")
    ap.add_argument("--shapes", nargs="+", default=["16384x8192"], help="MxK bf16 inputs (default 16384x8192)")
    ap.add_argument("--out")
    args = ap.parse_args()
    ops = torch.ops.fp8ext
    torch.manual_seed(0)
    s = torch.tensor(0.05, device="cuda")
    hist, s_d = torch.zeros(16, device="cuda"), torch.tensor(0.05, device="cuda")
    cases, sizes, moved = {}, {}, {}
    for shape in args.shapes:
        m, k = map(int, shape.split("x"))
        x = (torch.randn(m, k, device="cuda") * torch.exp2(torch.randint(-4, 4, (m, k), device="cuda").float())).to(torch.bfloat16)
        res, w = torch.randn_like(x), (1 + 0.1 * torch.randn(k, device="cuda")).to(torch.bfloat16)
        by_name = {
            "static": lambda x=x: ops.quantize_with_scale(x, s, F8, 0),
            "delayed": lambda x=x: ops.quantize_delayed(x, hist, s_d, F8, 0, False, True, 0)[0],
            "per_tensor_current": lambda x=x: ops.quantize_per_tensor(x, F8, 0, False, 0)[0],
            "group_1x128": lambda x=x: ops.quantize_per_group(x, F8, 0, False, 0)[0],
            # the fused RMSNorm quantizers (FP8EXT_RMS_RING); the residual one moves 7 bytes an element
            "rms_norm": lambda x=x, w=w: ops.rms_norm_quantize_per_row(x, w, 1e-5, F8, 0, False, 0),
            "add_rms_norm": lambda x=x, w=w, res=res: ops.add_rms_norm_quantize_per_row(x, res, w, 1e-5, F8, 0,
                                                                                         False, 0),
        }
        for name in args.cases or by_name:
            case = name if len(args.shapes) == 1 else f"{name}@{shape}"
            # bytes an element moves: the residual quantizer 7 (x, residual in; h, q out); per-tensor
            # current scaling 5 (x read twice: amax, then the codes), as bench_quantize counts them
            cases[case], sizes[case] = by_name[name], m * k
            moved[case] = {"add_rms_norm": 7, "per_tensor_current": 5}.get(name, 3)

    def assignments(st):
        return {args.var: st} if args.var else env_setting(st)

    named = {v for st in args.settings for v in assignments(st)}
    ref, times = {}, {(st, c): [] for st in args.settings for c in cases}
    for rnd in range(args.rounds):
        for st in args.settings:
            apply_env(assignments(st), named)
            for name, fn in cases.items():
                if rnd == 0 and not name.startswith("delayed"):  # no output may depend on the setting
                    out = fn()
                    bits = [t.view(torch.uint8).clone() for t in (out if isinstance(out, tuple) else (out,))]
                    want = ref.setdefault(name, bits)
                    assert all(torch.equal(a, b) for a, b in zip(bits, want)), (name, st)
                times[(st, name)].append(time_ms(fn) * 1e3)
    rows = []
    for (st, name), t in times.items():
        us = statistics.median(t)
        rows.append({"setting": st, "case": name, "us_rounds": [round(v, 2) for v in t], "us": round(us, 2),
                     "tb_s_3B": round(sizes[name] * 3 / us / 1e6, 3),
                     "tb_s_moved": round(sizes[name] * moved[name] / us / 1e6, 3)})
        print(f"{args.var or ''}{'=' if args.var else ''}{st} {name:32s} {us:8.2f} us  {rows[-1]['tb_s_moved']:.3f} TB/s  rounds {rows[-1]['us_rounds']}")
    if args.out:
        write_record(args.out, "ab_quant_env", {"var": args.var, "rows": rows})


if __name__ == "__main__":
    main()
