// Per-tensor current scaling of a large tensor in one cooperative launch: one
// block per SM (512 threads) reads its contiguous share of the chunks for the amax, keeping
// the last kKeepBytes of it in shared memory; the grid agrees on the amax
// (grid-wide barrier); then each block quantizes what it kept, and re-reads the
// rest of its share backwards, so the bytes it read last (still in L2) come first.
// Against two kernels (amax, then quantize) this saves the re-read of what fits
// on chip (132 x 192 KB of bf16 input on an H200), the kernel boundary, and the
// re-read of the L2-resident tail, which the two-kernel design lost because its
// blocks did not walk the tensor in the same order (bench/NOTES.md).
#include <cooperative_groups.h>

#include <algorithm>

#include "quant_common.cuh"
#include "quantize_per_tensor_fused.cuh"

namespace fp8ext::cuda::detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;  // one block per SM: 128 registers a thread, room for loads in flight
constexpr int kKeepBytes = 192 * 1024;  // of the 227 KB of shared memory a block may have

// The chunk a thread visits at step k is chunk start + k * kThreads + threadIdx.x,
// counted row-major over [rows, chunks_per_row]; a cursor follows its row and
// column across steps without dividing.
struct Cursor {
  int64_t r, c;
  int64_t dr, dc, chunks_per_row;

  __device__ Cursor(int64_t chunk, int64_t chunks_per_row)
      : r(chunk / chunks_per_row),
        c(chunk % chunks_per_row),
        dr(kThreads / chunks_per_row),
        dc(kThreads % chunks_per_row),
        chunks_per_row(chunks_per_row) {}

  __device__ __forceinline__ void next() {
    r += dr, c += dc;
    if (c >= chunks_per_row) c -= chunks_per_row, ++r;
  }
  __device__ __forceinline__ void prev() {
    r -= dr, c -= dc;
    if (c < 0) c += chunks_per_row, --r;
  }
};

// Chunks in flight per thread while reading for the amax: 128 bytes of input,
// 64 KB per SM (the H200 needs ~45 KB per SM in flight for full bandwidth; 256
// bytes spilled registers).
template <typename T>
constexpr int kInFlight = 128 / (kChunk * static_cast<int>(sizeof(T)));

template <typename T>
constexpr int kKeepSteps = kKeepBytes / (kThreads * static_cast<int>(sizeof(typename Input<T>::Raw)));

template <typename T>
constexpr size_t keep_smem_bytes() {
  return size_t{kKeepSteps<T>} * kThreads * sizeof(typename Input<T>::Raw);
}

template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kThreads, 1) fused_kernel(Input<T> in, Output out, int64_t chunks_per_row,
                                                             ScaleRule rule, float* scale_out, float* partials) {
  using Raw = typename Input<T>::Raw;
  constexpr int U = kInFlight<T>;
  constexpr int kWords = Input<T>::kWords;
  extern __shared__ uint4 kept[];  // [step][word][thread]: 16-byte accesses, conflict-free
  __shared__ float smem[32];
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): nothing in memory is touched before this

  const int t = threadIdx.x;
  const int64_t total = out.rows * chunks_per_row;
  const int64_t blocks = gridDim.x, b = blockIdx.x;
  const int64_t start = b * (total / blocks) + (b < total % blocks ? b : total % blocks);
  const int64_t end = start + total / blocks + (b < total % blocks ? 1 : 0);
  const int steps = static_cast<int>((end - start + kThreads - 1) / kThreads);
  const int keep_from = steps > kKeepSteps<T> ? steps - kKeepSteps<T> : 0;
  auto valid = [&](int k) { return start + int64_t{k} * kThreads + t < end; };

  // Phase 1: the amax, U steps at a time with all their loads issued before any
  // use. Every step is left in L2 (no evict-first hint); steps from keep_from on
  // are also kept in shared memory.
  float amax = 0.0f;
  Cursor cur(start + t, chunks_per_row);
  for (int k = 0; k < steps; k += U) {
    Raw raw[U] = {};
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (k + u < steps && valid(k + u)) in.template load_raw<false>(cur.r, cur.c * kChunk, raw[u]);
      cur.next();
    }
    amax = fmaxf(amax, raw_chunks_amax<T, U>(raw));
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int slot = k + u - keep_from;
      if (slot >= 0 && k + u < steps) {
#pragma unroll
        for (int w = 0; w < kWords; ++w) kept[(slot * kWords + w) * kThreads + t] = raw[u].words[w];
      }
    }
  }
  amax = block_max(amax, smem);
  if (t == 0) partials[b] = amax;
  cg::this_grid().sync();  // also orders the partials' writes before the reads below

  float m = 0.0f;
  for (int64_t i = t; i < blocks; i += kThreads) m = fmaxf(m, partials[i]);
  const float s = scale_from_amax(block_max(m, smem), rule);
  if (b == 0 && t == 0 && scale_out) *scale_out = s;
  const Scale scale(s);

  // Phase 2: what this thread kept (its own slots: no block barrier needed), then
  // the streamed steps backwards, the most recently read first.
  cur = Cursor(start + int64_t{keep_from} * kThreads + t, chunks_per_row);
  for (int k = keep_from; k < steps; ++k) {
    if (valid(k)) {
      Raw raw;
#pragma unroll
      for (int w = 0; w < kWords; ++w) raw.words[w] = kept[((k - keep_from) * kWords + w) * kThreads + t];
      float v[kChunk];
      Input<T>::unpack(raw, v);
      out.store(cur.r, cur.c * kChunk, quantize_chunk<F>(v, scale));
    }
    cur.next();
  }
  if (keep_from == 0) return;
  cur = Cursor(start + int64_t{keep_from - 1} * kThreads + t, chunks_per_row);
  constexpr int U2 = 4;  // chunks in flight while quantizing
  for (int k = keep_from - 1; k >= 0; k -= U2) {
    Raw raw[U2] = {};
    int64_t rr[U2], cc[U2];
#pragma unroll
    for (int u = 0; u < U2; ++u) {
      rr[u] = cur.r, cc[u] = cur.c;
      if (k - u >= 0 && valid(k - u)) in.load_raw(cur.r, cur.c * kChunk, raw[u]);
      cur.prev();
    }
#pragma unroll
    for (int u = 0; u < U2; ++u) {
      if (k - u < 0 || !valid(k - u)) continue;
      float v[kChunk];
      Input<T>::unpack(raw[u], v);
      out.store(rr[u], cc[u] * kChunk, quantize_chunk<F>(v, scale));
    }
  }
}

// Blocks of the cooperative grid on the current device (all resident at once),
// from the occupancy the kernel gets with its shared memory; 0 if it cannot run.
// Found once per device and host thread (the shared-memory opt-in is per device).
template <typename Kernel>
int cooperative_blocks(Kernel kernel, size_t smem) {
  constexpr int kMaxDevices = 64;
  thread_local int known[kMaxDevices] = {};  // blocks + 1; 0: not asked yet
  const DeviceInfo& dev = current_device_info();
  if (dev.device < kMaxDevices && known[dev.device] > 0) return known[dev.device] - 1;
  int per_sm = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) !=
          cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    per_sm = 0;
  }
  const int blocks = per_sm * dev.sm_count;
  if (dev.device < kMaxDevices) known[dev.device] = blocks + 1;
  return blocks;
}

}  // namespace

cudaError_t quantize_per_tensor_fused(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                                      float* scale_out, float* partials, int max_partials, cudaStream_t stream) {
  const int64_t chunks_per_row = ceil_div(q.padded_cols, kChunk);
  const Output out = make_output(q);
  cudaError_t err = cudaSuccess;
  dispatch(x, q.format, [&](auto in, auto fmt) {
    using T = typename decltype(in)::Element;
    auto* kernel = fused_kernel<T, decltype(fmt)::value>;
    constexpr size_t smem = keep_smem_bytes<T>();
    const int blocks = cooperative_blocks(kernel, smem);
    if (blocks < 1 || blocks > max_partials) {
      err = cudaErrorCooperativeLaunchTooLarge;
      return;
    }
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    config.attrs = attr;
    config.numAttrs = 1;
    err = cudaLaunchKernelEx(&config, kernel, in, out, chunks_per_row, rule, scale_out, partials);
  });
  return err;
}

}  // namespace fp8ext::cuda::detail
