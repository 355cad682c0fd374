import json
import subprocess
import sys


def test_info_runs():
    out = subprocess.run([sys.executable, "-m", "fp8ext.cli", "info", "--json"], check=True,
                         capture_output=True, text=True).stdout
    info = json.loads(out)
    assert info["formats"]["e5m2"]["max"] == 57344.0
    assert set(info["recipes"]) == {"CurrentScaling", "DelayedScaling", "PerTensorStatic", "RowWise", "BlockWise"}
    text = subprocess.run([sys.executable, "-m", "fp8ext.cli", "info"], check=True, capture_output=True,
                          text=True).stdout
    assert "e4m3: max 448" in text


def test_info_says_which_path_a_gpu_takes(monkeypatch, capsys):
    """The quantization and KV kernels carry compute_80 PTX: native on any GPU from sm_80 up
    (an sm_89 GPU was reported as taking the reference fallback), refused below it; only a
    build without CUDA kernels falls back to the reference. Simulated GPUs (works without one)."""
    import torch

    from fp8ext import _native, cli
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "a GPU")
    cases = [(("90a",), (8, 9), "native kernels, reference GEMM"), (("90a",), (10, 0), "native kernels"),
             (("90a",), (7, 0), "CUDA ops refused (they need sm_80 or newer)"),
             ((), (9, 0), "PyTorch reference fallback")]
    try:
        for archs, cap, path in cases:
            monkeypatch.setattr(_native, "cuda_archs", lambda archs=archs: archs)
            monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None, cap=cap: cap)
            _native.native_kernels_run_on.cache_clear(), _native.gemm_kernels_run_on.cache_clear()
            cli._print_info(cli.collect_info())
            assert f"GPU: a GPU (sm_{cap[0]}{cap[1]}): {path}" in capsys.readouterr().out, (archs, cap)
    finally:  # the real GPU's answers, not the simulated ones, for the tests after this one
        _native.native_kernels_run_on.cache_clear(), _native.gemm_kernels_run_on.cache_clear()
