"""Shared input generators for the quantization tests (CPU here, CUDA on the device)."""
import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
# (rows, cols): one row, one column, K = 1, 127, 129, 4100, partial 128-blocks on both sides.
SHAPES = [(1, 1), (1, 4100), (7, 1), (3, 127), (5, 129), (130, 257), (33, 1000), (256, 128)]


def random_input(shape, dtype, seed, outliers=True, non_finite=False, zero_row=False, signed_zeros=False):
    """Values spanning several binades, with outlier channels, optional NaN/Inf, a zero row and
    +0 / -0 scattered among the other values (1 element in 64: the CUDA kernels keep a zero's
    sign without an IEEE division, and -0 must stay the code 0x80)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-8, 8, shape, generator=g).float())
    if outliers and shape[-1] > 3:
        x[..., 3] *= 300.0
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    x = x.to(dtype)
    if signed_zeros and x.numel():  # before the NaN/Inf and the zero row, so as not to overwrite them
        zeros = torch.rand(shape, generator=g) < 1 / 64
        negative = torch.rand(shape, generator=g) < 0.5
        x[zeros & negative] = -0.0
        x[zeros & ~negative] = 0.0
    if non_finite and x.numel() >= 4:
        flat = x.view(-1)
        idx = torch.randperm(flat.numel(), generator=g)[:3]
        flat[idx[0]] = float("nan")
        flat[idx[1]] = float("inf")
        flat[idx[2]] = float("-inf")
    if zero_row and x.shape[0] > 1:
        x[1] = 0
    return x


def same_bits(got, want):
    """Equal bit for bit (FP8 as codes), NaNs wherever the other has them, whatever their sign."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    nan = want.float().isnan()
    if not torch.equal(got.float().isnan(), nan):
        return False
    if got.element_size() == 1:
        got, want = got.view(torch.uint8), want.view(torch.uint8)
    return torch.equal(got[~nan], want[~nan])


NEGATIVE_NAN_BITS = {torch.float32: (torch.int32, -0x400000), torch.float16: (torch.int16, -0x200),
                     torch.bfloat16: (torch.int16, -0x40)}  # 0xFFC00000, 0xFE00, 0xFFC0


def input_with_signed_nans(dtype, seed):
    """random_input (5, 300) with a negative NaN in column 7 and a positive one in
    column 100 of every row: their codes must be 0xFF and 0x7F."""
    x = random_input((5, 300), dtype, seed)
    int_type, bits = NEGATIVE_NAN_BITS[dtype]
    x.view(int_type)[:, 7] = bits
    x[:, 100] = float("nan")
    assert x[0, 7].isnan() and torch.signbit(x[0, 7]) and not torch.signbit(x[0, 100])
    return x
