import os
import random

import pytest
import torch


def _gpu_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (GPU tests run on the device: scripts/device/run.sh)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_skip_reason()
    if reason is None:
        return
    marker = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(marker)


@pytest.fixture(autouse=True)
def _gpu_tests_run_the_kernels(request):
    """A CPU-only build's CUDA ops fall back to the Python reference (with a
    warning), and a GPU test would then compare the reference with itself and
    pass: fail it instead (also below sm_80, where the CUDA ops refuse to run).
    FP8EXT_ALLOW_REFERENCE_FALLBACK=1 lets the GPU tests run on such a build or
    GPU on purpose."""
    if "gpu" not in request.keywords or os.environ.get("FP8EXT_ALLOW_REFERENCE_FALLBACK") == "1":
        return
    from fp8ext import _native
    device = torch.cuda.current_device()
    name = torch.cuda.get_device_name(device)
    if not _native.native_kernels_run_on(device):
        pytest.fail(f"this fp8ext build has no CUDA kernels that run on {name} (built for: "
                    f"{', '.join(_native.cuda_archs()) or 'none'}); rebuild, or set "
                    "FP8EXT_ALLOW_REFERENCE_FALLBACK=1 to test the reference fallback", pytrace=False)
    if torch.cuda.get_device_capability(device) == (9, 0) and not _native.GEMM_KERNELS_BUILT:
        pytest.fail(f"this fp8ext build lacks the CUTLASS sm_90a GEMMs that {name} runs; rebuild with "
                    "them, or set FP8EXT_ALLOW_REFERENCE_FALLBACK=1", pytrace=False)


@pytest.fixture
def seed(request):
    """A fresh seed per test (printed on failure); FP8EXT_TEST_SEED pins it."""
    s = int(os.environ.get("FP8EXT_TEST_SEED", random.randrange(2**31)))
    torch.manual_seed(s)
    request.node.user_properties.append(("seed", s))
    print(f"seed={s}")
    return s


@pytest.fixture
def cuda():
    return torch.device("cuda")
