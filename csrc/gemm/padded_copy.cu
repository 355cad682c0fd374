// copy_zero_padded (fp8ext/padded_copy.h). Memory-bound: a block per row at a
// time, consecutive threads on consecutive pieces of kWidth bytes (the widest
// access every address and stride allows), so a warp's accesses coalesce
// whatever the width.
#include <cstdint>

#include "fp8ext/cuda_launch.h"
#include "fp8ext/padded_copy.h"
#include "fp8ext/types.h"

namespace fp8ext::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;

template <int kWidth>
struct Piece;  // an integer of kWidth bytes
template <>
struct Piece<16> { using T = uint4; };
template <>
struct Piece<8> { using T = uint2; };
template <>
struct Piece<4> { using T = uint32_t; };
template <>
struct Piece<2> { using T = uint16_t; };
template <>
struct Piece<1> { using T = uint8_t; };

struct Copy {
  const uint8_t* src;
  int64_t src_rows, src_cols, src_stride;
  uint8_t* dst;
  int64_t dst_rows, dst_cols, dst_stride;
};

template <int kWidth>
union Bytes {
  typename Piece<kWidth>::T whole;
  uint8_t byte[kWidth];
};

// The piece at column c of a source row of `cols` bytes: whole where it lies
// inside the row, zeros past it, byte by byte where the row ends inside it.
template <int kWidth>
__device__ __forceinline__ Bytes<kWidth> load_piece(const uint8_t* row, int64_t cols, int64_t c) {
  Bytes<kWidth> v;
  v.whole = {};
  if (c + kWidth <= cols) {
    v.whole = *reinterpret_cast<const typename Piece<kWidth>::T*>(row + c);
  } else if (c < cols) {
#pragma unroll
    for (int i = 0; i < kWidth; ++i) v.byte[i] = c + i < cols ? row[c + i] : uint8_t{0};
  }
  return v;
}

// Stores the piece at column c of a destination row of `cols` bytes (the
// part of it inside the row).
template <int kWidth>
__device__ __forceinline__ void store_piece(uint8_t* row, int64_t cols, int64_t c, const Bytes<kWidth>& v) {
  if (c + kWidth <= cols) {
    *reinterpret_cast<typename Piece<kWidth>::T*>(row + c) = v.whole;
  } else {
#pragma unroll
    for (int i = 0; i < kWidth; ++i)
      if (c + i < cols) row[c + i] = v.byte[i];
  }
}

// Pieces a thread loads before it stores any: enough bytes in flight per SM
// at narrow widths too (one load at a time would leave 4-byte pieces at a
// fraction of the bandwidth).
template <int kWidth>
constexpr int kUnroll = kWidth >= 8 ? 2 : 4;

template <int kWidth>
__global__ void __launch_bounds__(kThreads) padded_copy_kernel(Copy p) {
  begin_dependent_kernel();  // PDL: src is often the kernel before's output, dst the next's input
  constexpr int64_t kStep = int64_t{kThreads} * kWidth;
  for (int64_t row = blockIdx.x; row < p.dst_rows; row += gridDim.x) {
    uint8_t* d = p.dst + row * p.dst_stride;
    // A zero row reads nothing (0 source columns): no pointer past src's end is formed.
    const bool live = row < p.src_rows;
    const uint8_t* s = live ? p.src + row * p.src_stride : p.src;
    const int64_t src_cols = live ? p.src_cols : 0;
    for (int64_t c0 = int64_t{threadIdx.x} * kWidth; c0 < p.dst_cols; c0 += kStep * kUnroll<kWidth>) {
      Bytes<kWidth> v[kUnroll<kWidth>];
#pragma unroll
      for (int u = 0; u < kUnroll<kWidth>; ++u) v[u] = load_piece<kWidth>(s, src_cols, c0 + u * kStep);
#pragma unroll
      for (int u = 0; u < kUnroll<kWidth>; ++u) {
        const int64_t c = c0 + u * kStep;
        if (c < p.dst_cols) store_piece<kWidth>(d, p.dst_cols, c, v[u]);
      }
    }
  }
}

// The widest power of two up to 16 dividing every address and row stride.
int widest_piece(const Copy& p) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(p.src) | reinterpret_cast<uintptr_t>(p.dst) |
                        static_cast<uint64_t>(p.src_rows > 1 ? p.src_stride : 0) |
                        static_cast<uint64_t>(p.dst_rows > 1 ? p.dst_stride : 0) | 16u;
  return static_cast<int>(bits & (~bits + 1));  // the lowest set bit
}

}  // namespace

cudaError_t copy_zero_padded(const void* src, int64_t src_rows, int64_t src_cols, int64_t src_stride, void* dst,
                             int64_t dst_rows, int64_t dst_cols, int64_t dst_stride, cudaStream_t stream) {
  if (src_rows < 0 || src_cols < 0 || src_stride < 0 || dst_rows < 0 || dst_cols < 0 ||
      (dst_rows > 1 && dst_stride < dst_cols) || (src_rows > 0 && src_cols > 0 && src == nullptr))
    return cudaErrorInvalidValue;
  if (dst_rows == 0 || dst_cols == 0) return cudaSuccess;
  if (dst == nullptr) return cudaErrorInvalidValue;
  const Copy p{static_cast<const uint8_t*>(src), src_rows, src_cols, src_stride,
               static_cast<uint8_t*>(dst), dst_rows, dst_cols, dst_stride};
  const int64_t cap = int64_t{current_device_info().sm_count} * kBlocksPerSm;
  const dim3 grid(static_cast<unsigned>(dst_rows < cap ? dst_rows : cap)), block(kThreads);
  switch (widest_piece(p)) {
    case 16: return launch(padded_copy_kernel<16>, grid, block, stream, p);
    case 8: return launch(padded_copy_kernel<8>, grid, block, stream, p);
    case 4: return launch(padded_copy_kernel<4>, grid, block, stream, p);
    case 2: return launch(padded_copy_kernel<2>, grid, block, stream, p);
    default: return launch(padded_copy_kernel<1>, grid, block, stream, p);
  }
}

}  // namespace fp8ext::cuda
