"""The `fp8ext` command line: `fp8ext info`."""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys

import torch


def collect_info() -> dict:
    import fp8ext
    from fp8ext import _native
    from fp8ext.formats import FORMATS
    from fp8ext.recipes import PRESETS

    gpu = None
    if torch.cuda.is_available():
        idx = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(idx)
        gpu = {"name": torch.cuda.get_device_name(idx), "capability": f"sm_{major}{minor}",
               "native_kernels": _native.native_kernels_run_on(idx),
               "gemm_kernels": _native.gemm_kernels_run_on(idx)}
    return {
        "fp8ext": fp8ext.__version__,
        "torch": torch.__version__,
        "cuda_kernels_built_for": list(_native.cuda_archs()) or None,
        "gemm_kernels_built": _native.GEMM_KERNELS_BUILT,
        "gpu": gpu,
        "formats": {f.name: {"torch_dtype": str(f.torch_dtype), "max": f.max, "min_normal": f.min_normal,
                             "min_subnormal": f.min_subnormal, "unit_roundoff": f.unit_roundoff,
                             "dynamic_range_binades": round(f.dynamic_range_binades, 2), "has_inf": f.has_inf}
                    for f in FORMATS},
        "recipes": {p.__name__: {"weights": p().weight_granularity,
                                 "activations": f"{p().activation_mode} {p().activation_granularity}"}
                    for p in PRESETS},
    }


def _print_info(info: dict) -> None:
    print(f"fp8ext {info['fp8ext']} (torch {info['torch']})")
    built = info["cuda_kernels_built_for"]
    print(f"  CUDA kernels: {'built for ' + ', '.join(built) if built else 'not built (CPU-only build)'}")
    print(f"  FP8 GEMMs (CUTLASS sm_90a): {'built' if info['gemm_kernels_built'] else 'not built'}")
    gpu = info["gpu"]
    if gpu:
        if gpu["native_kernels"]:
            path = "native kernels"
        elif built:
            path = "CUDA ops refused (they need sm_80 or newer)"
        else:
            path = "PyTorch reference fallback"
        path += ", CUTLASS GEMMs" if gpu["gemm_kernels"] else ", reference GEMM"
        print(f"  GPU: {gpu['name']} ({gpu['capability']}): {path}")
    else:
        print("  GPU: none (ops run through the CPU reference implementations)")
    print("  formats:")
    for name, f in info["formats"].items():
        print(f"    {name}: max {f['max']:g}, min normal {f['min_normal']:g}, min subnormal "
              f"{f['min_subnormal']:g}, unit roundoff {f['unit_roundoff']:g}, "
              f"{f['dynamic_range_binades']} binades, {'has' if f['has_inf'] else 'no'} Inf")
    print("  recipes:")
    for name, r in info["recipes"].items():
        print(f"    {name}: weights {r['weights']}, activations {r['activations']}")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _budget_gb(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of GB, got {text}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number of GB > 0, got {text}")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fp8ext", description="FP8 inference on NVIDIA Hopper")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="build capabilities, GPU, formats and recipes")
    p_info.add_argument("--json", action="store_true", help="print JSON")
    p_bench = sub.add_parser("bench", help="benchmarks that need a GPU")
    bench_sub = p_bench.add_subparsers(dest="suite", required=True)
    p_serve = bench_sub.add_parser("serve", help="serving engine: decode throughput/latency per precision mode")
    p_serve.add_argument("--out", default="bench-serve",
                         help="folder for serve.json (rewritten: give each part of a split sweep its own)")
    p_serve.add_argument("--quick", action="store_true", help="batch 1 and 64 at context 4096 only")
    p_serve.add_argument("--layers", type=_positive_int, default=32, help="decoder layers (32: the real depth)")
    p_serve.add_argument("--budget-gb", type=_budget_gb, default=80.0, help="memory budget for the max-batch column, in GiB (2^30 bytes)")
    p_serve.add_argument("--batches", type=_positive_int, nargs="+",
                         help="batch sizes (default: the full sweep's 1 8 32 64 128 256)")
    p_serve.add_argument("--contexts", type=_positive_int, nargs="+",
                         help="context lengths (default: the full sweep's 1024 4096 16384 32768); a sweep split "
                              "by context fits one device call per part")
    p_serve.add_argument("--modes", nargs="+", help="precision modes (default: all of bf16 bf16+fp8kv w8a8 w8a8+fp8kv)")
    p_report = sub.add_parser("report", help="the FP8 serving study: Markdown, HTML and plots")
    p_report.add_argument("--out", default="fp8ext-report", help="output folder")
    p_report.add_argument("--quick", action="store_true", help="small slices (about a minute on 2 CPU cores with --only cpu)")
    p_report.add_argument("--only", choices=("cpu", "gpu"), help="only the model (CPU) or the GPU sections")
    p_report.add_argument("--model", help="a local Hugging Face Llama checkpoint folder (default: SmolLM2-135M)")
    args = parser.parse_args(argv)
    if args.command == "report":
        from fp8ext.report import build_report
        if args.model is not None and not os.path.isdir(args.model):
            print(f"fp8ext report: --model must be a local Hugging Face checkpoint folder, got {args.model!r}",
                  file=sys.stderr)
            return 2
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            print(f"fp8ext report: --out must be a folder, {args.out!r} is a file", file=sys.stderr)
            return 2
        try:
            build_report(args.out, quick=args.quick, only=args.only, model=args.model)
        except (RuntimeError, ValueError, OSError) as e:  # a checkpoint that is not Llama, an unwritable --out
            print(f"fp8ext report: {e}", file=sys.stderr)
            return 1
        return 0
    if args.command == "bench":
        from fp8ext.serving import bench
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            print(f"fp8ext bench serve: --out must be a folder, {args.out!r} is a file", file=sys.stderr)
            return 2
        base = bench.QUICK if args.quick else bench.FULL
        sweep = dict(batches=tuple(args.batches or base["batches"]), contexts=tuple(args.contexts or base["contexts"]))
        try:
            bench.run(args.out, num_layers=args.layers, memory_budget_gb=args.budget_gb,
                      modes=tuple(args.modes or bench.MODES), sweep=sweep,
                      command=shlex.join(["fp8ext", *(sys.argv[1:] if argv is None else argv)]))
        except (RuntimeError, ValueError, OSError) as e:  # OSError: --out not writable (at the first row's save)
            print(f"fp8ext bench serve: {e}", file=sys.stderr)
            return 1
        return 0
    if args.command == "info":
        info = collect_info()
        if args.json:
            json.dump(info, sys.stdout, indent=2)
            print()
        else:
            _print_info(info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
