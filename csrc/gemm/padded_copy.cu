// copy_zero_padded (fp8ext/padded_copy.h). Memory-bound: each thread moves
// 16-byte chunks of dst (two at once, loads before stores, so that enough
// bytes are in flight), reading src in the widest pieces its address and
// stride allow and writing dst in the widest pieces dst's allow. Consecutive
// threads take consecutive chunks of a row, so every access coalesces.
#include <cstdint>
#include <type_traits>
#include <utility>

#include "fp8ext/cuda_launch.h"
#include "fp8ext/padded_copy.h"
#include "fp8ext/types.h"

namespace fp8ext::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 16;   // bytes of dst a thread moves at a time
constexpr int kUnroll = 2;   // chunks a thread loads before it stores any
constexpr int kMaxBlocksPerSm = 16;

struct Copy {
  const uint8_t* src;
  int64_t src_rows, src_cols, src_stride;
  uint8_t* dst;
  int64_t dst_rows, dst_cols, dst_stride;
  int64_t chunks_per_row, chunks;  // of dst
};

union Chunk {
  uint4 x16;
  uint2 x8[2];
  uint32_t x4[4];
  uint16_t x2[8];
  uint8_t x1[16];
};

// The j-th piece of kWidth bytes of a chunk (j constant after unrolling: registers, not memory).
template <int kWidth>
__device__ __forceinline__ auto& piece(Chunk& v, int j) {
  if constexpr (kWidth == 16) return v.x16;
  else if constexpr (kWidth == 8) return v.x8[j];
  else if constexpr (kWidth == 4) return v.x4[j];
  else if constexpr (kWidth == 2) return v.x2[j];
  else return v.x1[j];
}

template <int kWidth>
using PieceType = std::remove_reference_t<decltype(piece<kWidth>(std::declval<Chunk&>(), 0))>;

// The chunk at column c of a source row of `cols` bytes (0 for a zero row):
// whole pieces inside the row, zeros past it, byte by byte where it ends.
template <int kLoad>
__device__ __forceinline__ Chunk load_chunk(const uint8_t* row, int64_t cols, int64_t c) {
  Chunk v;
  v.x16 = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int j = 0; j < kChunk / kLoad; ++j) {
    const int64_t cc = c + j * kLoad;
    if (cc + kLoad <= cols) {
      piece<kLoad>(v, j) = *reinterpret_cast<const PieceType<kLoad>*>(row + cc);
    } else if (cc < cols) {
#pragma unroll
      for (int i = 0; i < kLoad; ++i)
        if (cc + i < cols) v.x1[j * kLoad + i] = row[cc + i];
    }
  }
  return v;
}

// Stores the part of the chunk at column c that lies inside a dst row of `cols` bytes.
template <int kStore>
__device__ __forceinline__ void store_chunk(uint8_t* row, int64_t cols, int64_t c, Chunk& v) {
#pragma unroll
  for (int j = 0; j < kChunk / kStore; ++j) {
    const int64_t cc = c + j * kStore;
    if (cc + kStore <= cols) {
      *reinterpret_cast<PieceType<kStore>*>(row + cc) = piece<kStore>(v, j);
    } else {
#pragma unroll
      for (int i = 0; i < kStore; ++i)
        if (cc + i < cols) row[cc + i] = v.x1[j * kStore + i];
    }
  }
}

template <int kLoad, int kStore>
__global__ void __launch_bounds__(kThreads) padded_copy_kernel(Copy p) {
  begin_dependent_kernel();  // PDL: src is often the kernel before's output, dst the next's input
  const int64_t step = int64_t{gridDim.x} * kThreads;
  // 32-bit division where the chunk count allows (every GEMM operand in practice).
  const bool narrow = p.chunks <= INT32_MAX;
  for (int64_t first = int64_t{blockIdx.x} * kThreads + threadIdx.x; first < p.chunks; first += step * kUnroll) {
    Chunk v[kUnroll];
    int64_t row[kUnroll], col[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = first + u * step;
      row[u] = narrow ? static_cast<uint32_t>(i) / static_cast<uint32_t>(p.chunks_per_row) : i / p.chunks_per_row;
      col[u] = (i - row[u] * p.chunks_per_row) * kChunk;
      // A zero row, or a chunk past the end, reads nothing (0 source columns).
      const bool live = i < p.chunks && row[u] < p.src_rows;
      v[u] = load_chunk<kLoad>(live ? p.src + row[u] * p.src_stride : p.src, live ? p.src_cols : 0, col[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (first + u * step < p.chunks) store_chunk<kStore>(p.dst + row[u] * p.dst_stride, p.dst_cols, col[u], v[u]);
  }
}

// The widest power of two up to 16 dividing an address and a row stride (the
// stride only counts with more than one row).
int widest_piece(const void* ptr, int64_t rows, int64_t stride) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(ptr) | static_cast<uint64_t>(rows > 1 ? stride : 0) | 16u;
  return static_cast<int>(bits & (~bits + 1));  // the lowest set bit
}

template <int kLoad>
cudaError_t launch_for_load(int store, dim3 grid, cudaStream_t stream, const Copy& p) {
  switch (store) {
    case 16: return launch(padded_copy_kernel<kLoad, 16>, grid, dim3(kThreads), stream, p);
    case 8: return launch(padded_copy_kernel<kLoad, 8>, grid, dim3(kThreads), stream, p);
    case 4: return launch(padded_copy_kernel<kLoad, 4>, grid, dim3(kThreads), stream, p);
    case 2: return launch(padded_copy_kernel<kLoad, 2>, grid, dim3(kThreads), stream, p);
    default: return launch(padded_copy_kernel<kLoad, 1>, grid, dim3(kThreads), stream, p);
  }
}

}  // namespace

cudaError_t copy_zero_padded(const void* src, int64_t src_rows, int64_t src_cols, int64_t src_stride, void* dst,
                             int64_t dst_rows, int64_t dst_cols, int64_t dst_stride, cudaStream_t stream) {
  if (src_rows < 0 || src_cols < 0 || src_stride < 0 || dst_rows < 0 || dst_cols < 0 ||
      (dst_rows > 1 && dst_stride < dst_cols) || (src_rows > 0 && src_cols > 0 && src == nullptr))
    return cudaErrorInvalidValue;
  if (dst_rows == 0 || dst_cols == 0) return cudaSuccess;
  if (dst == nullptr) return cudaErrorInvalidValue;
  const int64_t chunks_per_row = ceil_div(dst_cols, int64_t{kChunk});
  const Copy p{static_cast<const uint8_t*>(src), src_rows, src_cols, src_stride, static_cast<uint8_t*>(dst),
               dst_rows, dst_cols, dst_stride, chunks_per_row, dst_rows * chunks_per_row};
  const int64_t blocks = ceil_div(p.chunks, int64_t{kThreads} * kUnroll);
  const int64_t cap = int64_t{current_device_info().sm_count} * kMaxBlocksPerSm;
  const dim3 grid(static_cast<unsigned>(blocks < cap ? blocks : cap));
  const int store = widest_piece(dst, dst_rows, dst_stride);
  switch (widest_piece(src, src_rows, src_stride)) {
    case 16: return launch_for_load<16>(store, grid, stream, p);
    case 8: return launch_for_load<8>(store, grid, stream, p);
    case 4: return launch_for_load<4>(store, grid, stream, p);
    case 2: return launch_for_load<2>(store, grid, stream, p);
    default: return launch_for_load<1>(store, grid, stream, p);
  }
}

}  // namespace fp8ext::cuda
