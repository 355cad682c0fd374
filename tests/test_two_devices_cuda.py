"""Every kernel family on a second GPU of the same process, after the first has
run it: the kernel library keys its caches by device (device properties, the
kernels' shared-memory opt-ins, the amax slots), which a one-GPU machine never
exercises. The second GPU must give the first's bits (same GPU model, same
kernels): eagerly, replayed in a CUDA graph, and from two threads at once.
Needs two GPUs of one kind (device kind nvidia-h100-x2)."""
import threading

import pytest
import torch

import fp8ext
from fp8ext.recipes import BlockWise, CurrentScaling, RowWise
from cuda_graphs import capture

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (device kind nvidia-h100-x2)")]

E4M3 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def _split_k(monkeypatch):
    monkeypatch.setenv("FP8EXT_GEMM_SPLITS", "2")  # the "split_k" config's two slices and its reduce


def make_inputs(device):
    """Inputs on `device`, the same values for every device (made on the CPU)."""
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    pages, page_size, heads, dim = 200, 16, 2, 128
    table = torch.randperm(pages, generator=g)[:3 * 64].reshape(3, 64).to(torch.int32)
    return {"x": rnd(512, 1024), "w": rnd(1024, 1024), "big": rnd(2048, 4096), "norm_x": rnd(8192, 4096),
            "norm_w": rnd(4096), "q": rnd(3, 8, dim), "k_pool": rnd(pages, page_size, heads, dim, dtype=E4M3),
            "v_pool": rnd(pages, page_size, heads, dim, dtype=E4M3), "table": table.to(device),
            "lens": torch.tensor([300, 17, 1000], dtype=torch.int32).to(device),
            "one": torch.ones((), device=device)}


def run_ops(t):
    """One call of each kernel family; no host synchronisation (graph-capturable)."""
    out = {}
    qa, sa = fp8ext.quantize(t["x"], RowWise())
    qb, sb = fp8ext.quantize(t["w"], RowWise(), "weight")
    for config, m in (("large", 512), ("split_k", 48), ("swap_small", 16), ("gemv", 1)):
        out[f"scaled_mm {config}"] = fp8ext.scaled_mm(qa[:m], qb, sa[:m], sb, config=config)
    ba, bsa = fp8ext.quantize(t["x"], BlockWise())
    bb, bsb = fp8ext.quantize(t["w"], BlockWise(), "weight")
    out["scaled_mm block-wise"] = fp8ext.scaled_mm(ba, bb, bsa, bsb)
    out["per-tensor current q"], out["per-tensor current scale"] = fp8ext.quantize(t["big"], CurrentScaling())
    out["rms_norm q"], out["rms_norm scales"] = fp8ext.rms_norm_quantize(t["norm_x"], t["norm_w"], 1e-5, RowWise())
    out["decode"] = torch.ops.fp8ext.paged_decode_attention(t["q"], t["k_pool"], t["v_pool"], t["table"], t["lens"],
                                                            t["one"], t["one"], 128 ** -0.5, 3, 0, 0.0)
    return out


def assert_same_bits(got, want):
    assert got.keys() == want.keys()
    for name in want:
        g, w = got[name].cpu(), want[name].cpu()
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert torch.equal(g.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8)), name


def poison(t):
    if t.dtype in (E4M3, torch.float8_e5m2):
        t.view(torch.uint8).fill_(0x7F)
    else:
        t.fill_(float("nan"))


def on(device):
    with torch.cuda.device(device):
        result = run_ops(make_inputs(device))
        torch.cuda.synchronize()
    return result


def test_the_second_gpu_gives_the_firsts_bits():
    first = on("cuda:0")
    assert_same_bits(on("cuda:1"), first)
    assert_same_bits(on("cuda:0"), first)  # and back


def test_a_graph_captured_on_the_second_gpu_replays_the_firsts_bits():
    first = on("cuda:0")
    with torch.cuda.device(1):
        inputs = make_inputs("cuda:1")
        graph, out = capture(lambda: run_ops(inputs))
        for t in out.values():  # so the replay must write every output again
            poison(t)
        graph.replay()
        torch.cuda.synchronize()
    assert_same_bits(out, first)


def test_two_threads_on_two_gpus_at_once():
    first = on("cuda:0")
    results, errors = {}, []

    def work(device):
        try:
            for _ in range(3):
                results[device] = on(device)
        except Exception as e:  # noqa: BLE001  (reported below, with its device)
            errors.append((device, e))

    threads = [threading.Thread(target=work, args=(d,)) for d in ("cuda:0", "cuda:1")]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for device in ("cuda:0", "cuda:1"):
        assert_same_bits(results[device], first)
