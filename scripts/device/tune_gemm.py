"""Dispatch tuning for scaled_mm on the GPU: times tile configurations under the
run-time knobs of csrc/gemm/sm90_scaled_mm.cuh (FP8EXT_GEMM_SWIZZLE, _RASTER,
_PROMOTION; each setting runs in a child process of its own, though
they are read at each launch now: ab_gemm_env.py interleaves them in one
process) next to cuBLAS, and measures each variant's error against a
float64 reference.

    python3 scripts/device/tune_gemm.py --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LARGE = [(4096, 6144, 4096), (4096, 28672, 4096), (4096, 4096, 14336), (8192, 8192, 8192)]
DECODE = [(16, 6144, 4096), (16, 4096, 4096), (16, 4096, 14336), (16, 8192, 8192), (64, 6144, 4096),
          (128, 6144, 4096), (128, 4096, 14336)]
# (env, config, shapes)
SETTINGS = [({}, "large", LARGE)]
SETTINGS += [({"FP8EXT_GEMM_SWIZZLE": str(s)}, "large", LARGE) for s in (2, 4, 8)]
SETTINGS += [({"FP8EXT_GEMM_RASTER": str(r)}, "large", LARGE) for r in (1, 2)]
SETTINGS += [({"FP8EXT_GEMM_PROMOTION": p}, "large", LARGE) for p in ("4", "16")]
SETTINGS += [({}, "large_n192", LARGE), ({}, "wide_fast_accum", LARGE)]
SETTINGS += [({}, c, DECODE) for c in ("swap_small", "swap_medium", "medium")]


def child(config: str, shapes: list, anchor: bool) -> list:
    import torch

    import fp8ext
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from benchlib import copies_past_l2, graph_time_ms, relative_error, time_ms, whole_rounds

    f8 = torch.float8_e4m3fn
    rows = []
    for m, n, k in shapes:
        torch.manual_seed(0)
        copies = copies_past_l2(n * k) if m <= 128 else 1
        ws = [(torch.randn(n, k, device="cuda") * 2).to(f8) for _ in range(copies)]
        a = (torch.randn(m, k, device="cuda") * 2).to(f8)
        sa, sb = torch.rand(m, device="cuda") * 0.1 + 0.01, torch.rand(n, device="cuda") * 0.1 + 0.01
        state = {"i": 0}

        def ours():
            w = ws[state["i"] % len(ws)]
            state["i"] += 1
            return fp8ext.scaled_mm(a, w, sa, sb, config=config)

        def cublas(fast):
            w = ws[state["i"] % len(ws)]
            state["i"] += 1
            return torch._scaled_mm(a, w.t(), scale_a=sa[:, None], scale_b=sb[None, :], out_dtype=torch.bfloat16,
                                    use_fast_accum=fast)

        ref = (a.double() * sa[:, None].double()) @ (ws[0].double() * sb[:, None].double()).t()
        err = lambda d: relative_error(d, ref, torch.float64)  # noqa: E731
        state["i"] = 0
        row = {"shape": f"{m}x{n}x{k}", "config": config, "err": err(ours())}
        if not row["err"] < 1e-2:  # each timed configuration checked once
            raise AssertionError(f"{m}x{n}x{k} {config}: error {row['err']:.2e} against float64")
        timer = (lambda f: graph_time_ms(f, calls=whole_rounds(copies))) if m <= 128 else time_ms
        row["ms"] = timer(ours)
        if anchor:
            for fast in (False, True):
                state["i"] = 0
                row[f"cublas{'_fast' if fast else ''}_err"] = err(cublas(fast))
                row[f"cublas{'_fast' if fast else ''}_ms"] = timer(lambda: cublas(fast))
        row["TFLOPs"] = round(2 * m * n * k / row["ms"] / 1e9, 1)
        row["weight_TBps"] = round(n * k / row["ms"] / 1e9, 3)
        rows.append(row)
        del ws
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(child(spec["config"], [tuple(s) for s in spec["shapes"]], spec["anchor"])))
        return
    results = []
    for env, config, shapes in SETTINGS:
        anchor = not env and config in ("large", "swap_small")  # cuBLAS once per shape
        spec = json.dumps({"config": config, "shapes": shapes, "anchor": anchor})
        proc = subprocess.run([sys.executable, __file__, "--out", args.out, "--child", spec],
                              env={**os.environ, **env}, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{env} {config}: FAILED\n{proc.stderr[-2000:]}")
            continue
        for row in json.loads(proc.stdout.strip().splitlines()[-1]):
            row["env"] = " ".join(f"{k[12:]}={v}" for k, v in env.items()) or "-"
            results.append(row)
            extra = "".join(f" {k}={row[k]:.4g}" for k in ("cublas_ms", "cublas_fast_ms", "cublas_err",
                                                           "cublas_fast_err") if k in row)
            print(f"{row['shape']:>16} {config:>16} {row['env']:>22} {row['ms']*1e3:9.2f}us "
                  f"{row['TFLOPs']:7.1f}TF {row['weight_TBps']:.3f}TB/s err={row['err']:.2e}{extra}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tune_gemm.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
