"""The report's GPU sections on the device: they run and their figures are
consistent (every kernel beside its cuBLAS anchor, TFLOP/s from the times)."""
import pytest

pytestmark = pytest.mark.gpu

# FP8 dense tensor-core peak of an H100/H200 SXM (datasheet, ~1979 TFLOP/s): a timing above it
# measured nothing (an unsynchronised launch), whatever the GPU's speed.
PEAK_TFLOPS = 2000


def test_gpu_sections_run_and_hold_sane_figures(tmp_path):
    """The figures only (no speed is asserted: bench/ measures speed, side by side in one run)."""
    from fp8ext.report import gpu
    rows = gpu.gemm_economics()
    shapes = {(r["M"], r["N"], r["K"]) for r in rows}
    for shape in shapes:
        kernels = {r["kernel"] for r in rows if (r["M"], r["N"], r["K"]) == shape}
        for scales in ("per-tensor", "row-wise", "block-wise"):  # ours and cuBLAS side by side
            assert {f"fp8 {scales} (fp8ext)", f"fp8 {scales} (cuBLAS)"} <= kernels, shape
    for r in rows:
        flops = 2 * r["M"] * r["N"] * r["K"]
        assert r["ms"] > 0 and 0 < r["TFLOP/s"] < PEAK_TFLOPS, r
        assert r["TFLOP/s"] == pytest.approx(flops / r["ms"] / 1e9, rel=0.02, abs=0.1), r  # ms rounded to 4 places
    for r in gpu.unaligned_cost():
        assert r["aligned ms"] > 0 and r["unaligned ms"] > 0, r
        # "cost" is unaligned / aligned of the unrounded times; the ms columns are rounded to 4 decimals.
        assert float(r["cost"].rstrip("x")) == pytest.approx(r["unaligned ms"] / r["aligned ms"], rel=0.02), r
    pytest.importorskip("matplotlib", reason="matplotlib draws the roofline (the figures above are checked)")
    gpu.plot_roofline(rows, str(tmp_path / "roofline.png"))
    assert (tmp_path / "roofline.png").stat().st_size > 5_000
