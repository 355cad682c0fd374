"""FP8 formats: constants, decoding, and the cast (saturating and torch's rules)."""
import math

import pytest
import torch

from fp8ext import formats
from fp8ext.formats import E4M3, E5M2

FMTS = [E4M3, E5M2]


def test_constants():
    assert (E4M3.max, E4M3.min_normal, E4M3.min_subnormal, E4M3.unit_roundoff) == (448.0, 2**-6, 2**-9, 2**-4)
    assert (E5M2.max, E5M2.min_normal, E5M2.min_subnormal, E5M2.unit_roundoff) == (57344.0, 2**-14, 2**-16, 2**-3)
    for f in FMTS:
        fi = torch.finfo(f.torch_dtype)
        assert f.max == fi.max and f.min_normal == fi.tiny and f.unit_roundoff == fi.eps / 2
        assert f.dynamic_range == f.max / f.min_subnormal
    assert not E4M3.has_inf and E5M2.has_inf
    assert formats.get_format("E5M2") is E5M2 and formats.get_format(torch.float8_e4m3fn) is E4M3


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
def test_decode_all_codes_matches_torch(fmt):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    ours = formats.decode(codes, fmt)
    theirs = codes.view(fmt.torch_dtype).float()
    assert torch.equal(torch.isnan(ours), torch.isnan(theirs))
    ok = ~torch.isnan(theirs)
    assert torch.equal(ours[ok], theirs[ok])
    assert torch.equal(torch.signbit(ours[ok]), torch.signbit(theirs[ok]))


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
def test_non_finite_codes_are_exactly_the_nan_and_inf_codes(fmt):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fmt.torch_dtype)
    want = ~torch.isfinite(codes.float())
    assert torch.equal(formats.non_finite_codes(codes), want)
    assert int(want.sum()) == (8 if fmt.has_inf else 2)  # E5M2: +-inf and 6 NaNs; E4M3: +-NaN
    with pytest.raises(TypeError, match="codes must be float8"):
        formats.non_finite_codes(torch.zeros(4, dtype=torch.uint8))


def _all_16bit(dtype):
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype)


def _boundary_floats(fmt):
    """Every code's value, every midpoint and their float32 neighbours, both signs."""
    vals = formats.decode(torch.arange(256, dtype=torch.int32).to(torch.uint8), fmt)
    vals = vals[torch.isfinite(vals)].double().unique()
    step = 2.0 ** (math.floor(math.log2(fmt.max)) - fmt.mantissa_bits)
    vals = torch.cat([vals, torch.tensor([fmt.max + step], dtype=torch.float64)])
    mids = ((vals[1:] + vals[:-1]) / 2).float()
    pts = torch.cat([vals.float(), mids, torch.nextafter(mids, torch.zeros_like(mids)),
                     torch.nextafter(mids, torch.full_like(mids, math.inf))])
    return torch.cat([pts, -pts])


def _random_floats(n, seed):
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-2**31, 2**31 - 1, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    return bits.view(torch.float32)


def _torch_saturates(fmt):
    """torch >= 2.12 saturates E4M3 in `.to()` (Inf and overflow -> 448); older torch gives NaN."""
    big = torch.tensor([fmt.max * 2, math.inf])
    return bool((big.to(fmt.torch_dtype).float() == fmt.max).all())


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
def test_non_saturating_cast_matches_torch(fmt, seed):
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, 3e38, -3e38])
    overflow_at = fmt.max + 2.0 ** (math.floor(math.log2(fmt.max)) - fmt.mantissa_bits) / 2
    for x in [_all_16bit(torch.bfloat16), _all_16bit(torch.float16), _boundary_floats(fmt),
              _random_floats(200_000, seed), specials]:
        theirs = x.to(fmt.torch_dtype).view(torch.uint8)
        ours = formats.cast(x, fmt, saturate=False).view(torch.uint8)
        if _torch_saturates(fmt):
            # This torch saturates: it must then agree with our saturating cast everywhere,
            # and with the non-saturating one wherever no overflow happens.
            assert torch.equal(formats.cast(x, fmt).view(torch.uint8), theirs)
            ax = x.float().abs()
            # At the tie the even code wins: 464 -> 448 in E4M3, 61440 -> Inf in E5M2.
            in_range = ~((ax > overflow_at) | ((ax == overflow_at) & (fmt is E5M2)))
            assert torch.equal(ours[in_range], theirs[in_range])
            overflowed = ours[~in_range & ~torch.isnan(x)] & 0x7F
            assert (overflowed == (0x7F if fmt is E4M3 else 0x7C)).all()
        else:
            assert torch.equal(ours, theirs), x.dtype


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
def test_python_reference_casts_match_the_native_op(fmt, seed):
    # ops.reference serves GPUs without our kernels: it must not follow this torch's `.to()` rules.
    from fp8ext.ops import reference
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, 3e38, -3e38])
    for x in [_all_16bit(torch.bfloat16), _boundary_floats(fmt), _random_floats(200_000, seed), specials]:
        for saturate in (True, False):
            want = formats.cast(x, fmt, saturate=saturate).view(torch.uint8)
            got = reference.cast_to_fp8(x.float().reshape(1, -1), fmt.torch_dtype, saturate).view(torch.uint8)
            assert torch.equal(got.reshape(want.shape), want), (x.dtype, saturate)


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
def test_saturating_cast_is_clamp_then_round(fmt, seed):
    for x in [_all_16bit(torch.bfloat16), _all_16bit(torch.float16), _boundary_floats(fmt),
              _random_floats(200_000, seed)]:
        ours = formats.cast(x, fmt)
        want = x.float().clamp(-fmt.max, fmt.max).to(fmt.torch_dtype)
        assert torch.equal(ours.view(torch.uint8), want.view(torch.uint8))
        finite = torch.isfinite(x)
        decoded = ours.float()
        assert torch.isfinite(decoded[finite]).all(), "a finite input became NaN/Inf"
        assert torch.isnan(decoded[torch.isnan(x)]).all()


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
def test_saturating_cast_of_infinities_and_overflow(fmt):
    x = torch.tensor([math.inf, -math.inf, 1e30, -1e30, fmt.max * 1.2])
    got = formats.cast(x, fmt).float()
    assert got.tolist() == [fmt.max, -fmt.max, fmt.max, -fmt.max, fmt.max]


def test_e5m2_where_torch_overflows_we_saturate():
    x = torch.tensor([61440.0, 65536.0])
    assert torch.isinf(x.to(torch.float8_e5m2).float()).all()
    assert formats.cast(x, E5M2).float().tolist() == [57344.0, 57344.0]


def test_cast_keeps_shape_and_handles_any_rank():
    x = torch.randn(2, 3, 4)
    assert formats.cast(x).shape == x.shape
    assert formats.cast(torch.tensor(3.0)).shape == ()
    assert formats.cast(torch.randn(2, 0, 5)).shape == (2, 0, 5)


def test_format_argument_errors():
    with pytest.raises(ValueError, match="fmt"):
        formats.get_format("e3m4")
    with pytest.raises(TypeError, match="fmt"):
        formats.get_format(3)
    with pytest.raises(TypeError, match="x must be"):
        formats.cast(torch.ones(3, dtype=torch.int32))
    with pytest.raises(TypeError, match="codes"):
        formats.decode(torch.ones(3), E4M3)
