// A byte matrix copied into another with zeros past the source's rows and
// columns: how the GEMM ops hand the CUTLASS kernels operands (and per-channel
// vectors) they cannot take as they are (K not a multiple of 16, rows not
// 16-byte aligned). One pass over the destination, in place of zero-filling it
// and copying into a strided view (torch's copy of 1-byte elements into a
// strided view moves a byte per thread). Its stores are 16 bytes wide into
// 16-byte-aligned rows; into narrower rows (dropping a D's padded columns)
// it works, but slower than it could: the ops leave that to torch's copy.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp8ext::cuda {

// dst[r][c] = (r < src_rows && c < src_cols) ? src[r][c] : 0 for every
// r < dst_rows, c < dst_cols. Sizes and row strides in bytes: dst's rows
// must not overlap (dst_stride >= dst_cols), src's may (a stride of 0 repeats
// a row), and src and dst must not overlap each other. Launched with PDL on
// `stream`. cudaErrorInvalidValue for negative sizes or strides, dst rows
// that overlap, or a null pointer where bytes are to be moved.
cudaError_t copy_zero_padded(const void* src, int64_t src_rows, int64_t src_cols, int64_t src_stride, void* dst,
                             int64_t dst_rows, int64_t dst_cols, int64_t dst_stride, cudaStream_t stream);

}  // namespace fp8ext::cuda
