"""The report's GPU sections on the device: they run, and their GEMM figure
agrees with the benchmark's recorded one (bench/results)."""
import json
import os

import pytest

pytestmark = pytest.mark.gpu

RESULTS = os.path.join(os.path.dirname(__file__), "..", "bench", "results", "gemm_2026-11-29_h200_run7_pdl_configs.json")
BLOCKWISE = os.path.join(os.path.dirname(__file__), "..", "bench", "results",
                         "gemm_blockwise_2026-12-04_h200_session23_6963079.json")


def recorded_blockwise_ratio() -> float:
    """The bench's fp8ext / cuBLAS block-wise time ratio at 4096^3 (higher is faster)."""
    with open(BLOCKWISE) as f:
        return next(r["ratio"] for r in json.load(f) if r.get("shape") == "4096x4096x4096")


def test_gpu_sections_run_and_agree_with_bench_results(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib draws the roofline")
    from fp8ext.report import gpu
    rows = gpu.gemm_economics()
    ours = next(r for r in rows if (r["M"], r["N"], r["K"]) == (4096, 4096, 4096)
                and r["kernel"] == "fp8 per-tensor (fp8ext)")
    with open(RESULTS) as f:
        recorded = next(r for r in json.load(f) if r["shape"] == "4096x4096x4096" and r["scales"] == "per-tensor"
                        and r["config"] == "auto" and r["accumulation"] == "promoted")
    # Compute-bound, so L2 reuse (the report does not rotate weights) does not matter here.
    assert 0.85 < ours["TFLOP/s"] / recorded["ours_TFLOPs"] < 1.15, (ours, recorded["ours_TFLOPs"])
    kernels = {r["kernel"] for r in rows}
    for scales in ("per-tensor", "row-wise", "block-wise"):  # ours and cuBLAS side by side
        assert {f"fp8 {scales} (fp8ext)", f"fp8 {scales} (cuBLAS)"} <= kernels
    # Block-wise against its cuBLAS anchor of the same run: the report graph-times 10 calls back to back,
    # the bench times single calls with events, and that alone moved the block-wise TFLOP/s by ~15% (1310
    # against 1139 recorded, session 32). A ratio measured side by side does not carry that difference.
    block = {r["kernel"]: r["TFLOP/s"] for r in rows if (r["M"], r["N"], r["K"]) == (4096, 4096, 4096)}
    ratio = block["fp8 block-wise (fp8ext)"] / block["fp8 block-wise (cuBLAS)"]
    recorded_ratio = recorded_blockwise_ratio()
    assert 0.85 < ratio / recorded_ratio < 1.15, (block, recorded_ratio)
    gpu.plot_roofline(rows, str(tmp_path / "roofline.png"))
    assert (tmp_path / "roofline.png").stat().st_size > 5_000
    for r in gpu.unaligned_cost():
        assert r["aligned ms"] > 0 and r["unaligned ms"] > 0, r
        # "cost" is unaligned / aligned of the unrounded times; the ms columns are rounded to 4 decimals.
        assert float(r["cost"].rstrip("x")) == pytest.approx(r["unaligned ms"] / r["aligned ms"], rel=0.02), r
