"""bench/benchlib.py's L2 rotation and output check, which every benchmark's
figures rest on (they run on the GPU machine; the helpers are plain PyTorch)."""
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
from benchlib import check_output, print_table, rotating, worst_slice_error  # noqa: E402


@pytest.mark.parametrize("copies", [1, 3, 7, 8, 20, 21, 40])
def test_a_rotating_graph_goes_round_whole_cycles(copies):
    """A replay must start where the last one ended's next item is, and no item may
    come back sooner than after all the others (copies - 1 calls apart)."""
    seen = []
    call, calls = rotating(seen.append, list(range(copies)))
    for _ in range(2):  # capture_graph's two warm-up calls, outside the graph
        call()
    seen.clear()
    for _ in range(calls):  # what a graph captures: replayed as it is, again and again
        call()
    assert calls >= 20 and calls % copies == 0
    replayed = seen * 3
    for i in range(len(replayed) - copies):
        assert replayed[i] not in replayed[i + 1:i + copies], (copies, i)


def test_check_output_catches_a_zeroed_tile_the_whole_error_hides():
    torch.manual_seed(0)
    ref = torch.randn(2048, 8192)
    got = ref.to(torch.bfloat16).float()  # output rounding: passes
    assert check_output(got, ref, "rounded") < 5e-3
    bad = got.clone()
    bad[:32, :32] = 0  # (a 128 x 128 tile of a 16384 x 57344 D is the same share)
    assert (bad - ref).norm() / ref.norm() < 1e-2  # the whole output's error alone would pass it
    with pytest.raises(AssertionError, match="worst row / column"):
        check_output(bad, ref, "zeroed tile")


def test_check_output_catches_one_wrong_row_and_nans():
    ref = torch.randn(4096, 1024)
    bad = ref.clone()
    bad[17] *= 1.1
    with pytest.raises(AssertionError):
        check_output(bad, ref, "row")
    assert worst_slice_error(bad, ref, columns=False) == pytest.approx(0.1, rel=1e-3)
    nan = ref.clone()
    nan[3, 5] = float("nan")
    with pytest.raises(AssertionError, match="NaN"):
        check_output(nan, ref, "nan")


def test_check_output_passes_an_m1_output_with_values_near_zero():
    """A [1, N] output's columns are single values; two correct kernels that sum
    in another order differ by ~1e-4 of the typical value even where a value is
    ~0, which must not fail the check (it did before slice norms were floored)."""
    torch.manual_seed(1)
    ref = torch.randn(1, 6144)
    ref[0, :8] = torch.tensor([0.0, 1e-6, -1e-5, 3e-4, 1e-3, -2e-3, 5e-3, 1e-2])
    got = (ref + 1e-4 * torch.randn(1, 6144)).to(torch.bfloat16)
    assert check_output(got, ref, "M = 1") < 3e-2
    fast = ref + 0.0044 * torch.randn(1, 6144)  # cuBLAS's fast accumulation's whole error, per value
    assert check_output(fast, ref, "M = 1, fast accumulation") < 3e-2
    bad = got.clone()
    bad[0, 100:228] = 0  # a 128-wide tile's worth of one row
    with pytest.raises(AssertionError):
        check_output(bad, ref, "M = 1, zeroed")


def test_print_table_of_no_rows_prints_nothing(capsys):
    """bench_decode --writes-only has no attention rows: its table is skipped, not a TypeError."""
    print_table([], ["batch", "context"])
    print_table([{"tokens": 64, "ms": 0.002}], ["tokens", "ms"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].split() == ["tokens", "ms"] and lines[1].split() == ["64", "0.002"]
