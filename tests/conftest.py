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
