// RMSNorm fused with per-token quantization, one block per row: what a
// decoder layer feeds its FP8 projections, in one launch where the unfused
// path takes the norm, the weight multiply and the quantize kernel.
//   y = w * T(x * rsqrt(mean(x^2) + eps))   (Hugging Face Llama's rounding:
//                                             normalized in fp32, rounded to
//                                             x's type, then times the weight)
//   q = per-row quantization of y, as quantize_per_row.
// Each thread keeps its own chunk of the row in registers (rows up to
// kThreads chunks, K = 8192, are read once), and its y once computed: one copy
// of each step's code, since code size is time here (see quantize_chunk);
// longer rows re-read their tail, mostly from L2. The residual variant first adds the sublayer's
// output to the residual stream (h = T(x + residual), written out: the next
// residual) and normalizes h, so a decoder's residual add is no launch of its own;
// with many rows it also asks L2 for the rows one wave ahead (prefetch_wave).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "bulk_copy.cuh"
#include "fp8ext/quantize_cuda.h"
#include "quant_common.cuh"
#include "row_quantize.cuh"

namespace fp8ext::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 512;

// y of one chunk at column c0, in T (y is rounded to T anyway); columns past
// `cols` are 0, also when the row's norm is NaN. Rounding 16-bit T in pairs
// made the kernels 6-11% faster than per-element roundings through fp32
// (H100, scripts/device/rms_timeline.cu,
// bench/results/rms_quantize_ab_2026-12-05_h100_session38_*), same bits.
template <typename T>
__device__ __forceinline__ typename Input<T>::Raw normalize_chunk(const typename Input<T>::Raw& x,
                                                                  const typename Input<T>::Raw& w, int64_t c0,
                                                                  int64_t cols, float inv_rms) {
  return rounded_product_chunk<T>(x, w, c0, cols, [inv_rms](float v) { return v * inv_rms; });
}

// The residual add of the kAdd variant: x + residual rounded to T (PyTorch's
// `x + residual`), written to sum_out [rows, cols] (contiguous).
template <typename T>
struct ResidualAdd {
  Input<T> residual;
  T* sum_out;

  // Loads chunk c0 of row r of x (`in`) and adds the residual's.
  __device__ __forceinline__ void load_sum(const Input<T>& in, int64_t r, int64_t c0, float (&v)[kChunk]) const {
    float res[kChunk];
    in.template load<true>(r, c0, v);
    residual.template load<true>(r, c0, res);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = to_float(from_float<T>(v[i] + res[i]));
  }

  // Writes chunk c0 of row r of the sum (v: values already in T).
  __device__ __forceinline__ void store(int64_t r, int64_t c0, const float (&v)[kChunk]) const {
    T* p = sum_out + r * residual.cols + c0;
    if (c0 + kChunk <= residual.cols && residual.vec) {
      typename Input<T>::Raw raw;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) raw.elems[i] = from_float<T>(v[i]);
#pragma unroll
      for (int i = 0; i < Input<T>::kWords; ++i) reinterpret_cast<uint4*>(p)[i] = raw.words[i];
    } else {
#pragma unroll
      for (int i = 0; i < kChunk; ++i)
        if (c0 + i < residual.cols) p[i] = from_float<T>(v[i]);
    }
  }
};

// kPrefetch (residual variant only): ask L2 for the rows `wave` blocks ahead.
// The bounds' second figure: under the plain 512-thread bound ptxas kept the
// residual kernel to 64 registers and spilled; with room (78 in bf16, three
// 256-thread blocks an SM at 4096 columns) it ran 8192 x 4096 in 84.4 us
// against 101.1 (H100, bench/NOTES.md session 44). The plain kernel keeps 58
// (bf16) under "2"; its fp32 build spills 224 bytes there (67 registers with no
// second figure), unmeasured, as fp32 is everywhere in this file.
template <typename T, Fp8Format F, bool kAdd, bool kPrefetch = false>
__global__ void __launch_bounds__(kThreads, kAdd ? 1 : 2)
    rms_norm_quantize_kernel(Input<T> in, Input<T> weight, float eps, Output out, ScaleRule rule, float* row_scales,
                             ResidualAdd<T> add, int64_t wave) {
  using Raw = typename Input<T>::Raw;
  __shared__ float smem[32];
  const int64_t r = blockIdx.x, own = threadIdx.x;  // `own`: the chunk this thread keeps
  const int64_t read_chunks = ceil_div(in.cols, kChunk);
  const int64_t write_chunks = ceil_div(out.padded_cols, kChunk);
  // The weight's own chunk is asked of L2 before the PDL wait (no kernel before
  // writes it; see prefetch_l2) and loaded with x's, not after the norm's
  // reduction: at decode sizes that is one memory round trip less.
  if (own < read_chunks && own % kChunksPerLine<T> == 0) prefetch_l2(weight.data + own * kChunk);
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): only the prefetch above comes before this
  if constexpr (kAdd && kPrefetch) {  // the rows of the block taking this one's place (see the host)
    if (wave > 0 && r + wave < in.rows) {
      const T* x_next = in.data + (r + wave) * in.row_stride;
      const T* res_next = add.residual.data + (r + wave) * add.residual.row_stride;
      prefetch_span_l2(x_next, x_next + in.cols);
      prefetch_span_l2(res_next, res_next + in.cols);
    }
  }
  Raw h[1], w_own[1], res[1];  // the own chunks of x (or of x + residual), the weight and the residual
  issue_row_chunks(in, r, read_chunks, h);  // every load in flight before any is waited for
  issue_row_chunks(weight, 0, read_chunks, w_own);
  if constexpr (kAdd) issue_row_chunks(add.residual, r, read_chunks, res);
  // The element-wise rest inline (<false>): out of line, the residual kernel took 85 registers.
  finish_row_chunks<false>(in, r, read_chunks, h);
  finish_row_chunks<false>(weight, 0, read_chunks, w_own);
  if constexpr (kAdd) {  // written out once: the next residual
    finish_row_chunks<false>(add.residual, r, read_chunks, res);
    float a[kChunk], b[kChunk];
    Input<T>::unpack(h[0], a);
    Input<T>::unpack(res[0], b);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      h[0].elems[i] = from_float<T>(a[i] + b[i]);
      a[i] = to_float(h[0].elems[i]);
    }
    if (own < read_chunks) add.store(r, own * kChunk, a);
  }
  // Loads chunk c0 of the row being normalized (x, or x + residual) past the own chunks.
  auto load_tail = [&](int64_t c0, float (&v)[kChunk]) {
    if constexpr (kAdd) {
      add.load_sum(in, r, c0, v);
    } else {
      in.template load<true>(r, c0, v);
    }
  };
  auto squares = [](const float (&v)[kChunk]) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) s = fmaf(v[i], v[i], s);
    return s;
  };
  float ss;
  {
    float v[kChunk];
    Input<T>::unpack(h[0], v);
    ss = squares(v);
  }
  for (int64_t c = own + blockDim.x; c < read_chunks; c += blockDim.x) {
    float v[kChunk];
    load_tail(c * kChunk, v);
    if constexpr (kAdd) add.store(r, c * kChunk, v);
    ss += squares(v);
  }
  const float inv_rms = 1.0f / sqrtf(block_sum(ss, smem) / static_cast<float>(in.cols) + eps);

  Raw y_own;  // y of the own chunk, in T
  if (own < write_chunks) y_own = normalize_chunk<T>(h[0], w_own[0], own * kChunk, weight.cols, inv_rms);
  // Calls fn(c0, y) for every written chunk of the row, the own one first.
  auto for_each_y = [&](auto&& fn) {
    if (own < write_chunks) fn(own * kChunk, y_own);
    for (int64_t c = own + blockDim.x; c < write_chunks; c += blockDim.x) {
      float v[kChunk];
      load_tail(c * kChunk, v);
      Raw x_raw, w_raw;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) x_raw.elems[i] = from_float<T>(v[i]);  // exact: v is in T
      weight.template load_raw<true>(0, c * kChunk, w_raw);
      fn(c * kChunk, normalize_chunk<T>(x_raw, w_raw, c * kChunk, weight.cols, inv_rms));
    }
  };
  quantize_row<F, T>(for_each_y, out, r, rule, row_scales, smem);
}


// The ring kernel: a grid of one wave, block b taking rows b, b + gridDim.x, ...
// Thread 0 copies the block's next rows into a ring of kRingRows shared-memory
// slots with the TMA unit (cp.async.bulk, x and the residual's row in one slot),
// up to kRingRows - 1 rows ahead of the one being normalized: the one-row
// kernel above has no load in flight while its block reduces (twice a row), and
// at 8192 x 4096 bf16 it moves 1.75 TB/s on an H100 whose copies reach ~2.9.
// The weight's chunk stays in registers for all of a block's rows. Rows of
// whole chunks (cols % kChunk == 0), 16-byte aligned, one chunk per thread at
// most (the host's ring_applies).
constexpr int kRingRows = 3;

template <typename T, Fp8Format F, bool kAdd>
__global__ void __launch_bounds__(kThreads) rms_norm_quantize_ring_kernel(Input<T> in, Input<T> weight, float eps,
                                                                          Output out, ScaleRule rule,
                                                                          float* row_scales, ResidualAdd<T> add) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Raw = typename Input<T>::Raw;
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ uint64_t full[kRingRows];
  __shared__ float smem[32];
  const int64_t own = threadIdx.x;
  const int64_t read_chunks = in.cols / kChunk;
  const int64_t write_chunks = ceil_div(out.padded_cols, kChunk);
  const uint32_t row_bytes = static_cast<uint32_t>(in.cols * sizeof(T));
  const uint32_t slot_bytes = kAdd ? 2 * row_bytes : row_bytes;
  const int64_t rows = ceil_div(in.rows - blockIdx.x, int64_t{gridDim.x});  // this block's: the grid is <= in.rows
  if (own < read_chunks && own % kChunksPerLine<T> == 0) prefetch_l2(weight.data + own * kChunk);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kRingRows; ++s) barrier_init(&full[s]);
    fence_barrier_init();
  }
  __syncthreads();
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): only the prefetch above comes before this
  const uint64_t policy = evict_first_policy();
  auto issue = [&](int64_t j) {  // thread 0: the block's row j into slot j % kRingRows
    const int64_t r = blockIdx.x + j * gridDim.x;
    uint8_t* slot = ring + (j % kRingRows) * slot_bytes;
    uint64_t* bar = &full[j % kRingRows];
    barrier_expect_bytes(bar, slot_bytes);
    bulk_copy(slot, in.data + r * in.row_stride, row_bytes, bar, policy);
    if constexpr (kAdd) bulk_copy(slot + row_bytes, add.residual.data + r * add.residual.row_stride, row_bytes, bar,
                                  policy);
  };
  if (threadIdx.x == 0)
    for (int64_t j = 0; j < kRingRows && j < rows; ++j) issue(j);
  Raw w_own[1];
  load_row_chunks<true>(weight, 0, read_chunks, w_own);
  for (int64_t j = 0; j < rows; ++j) {
    const int64_t r = blockIdx.x + j * gridDim.x;
    barrier_wait(&full[j % kRingRows], static_cast<uint32_t>(j / kRingRows) & 1u);
    const uint8_t* slot = ring + (j % kRingRows) * slot_bytes;
    Raw h;
    if (own < read_chunks) {
      h = reinterpret_cast<const Raw*>(slot)[own];
    } else {
#pragma unroll
      for (int i = 0; i < Input<T>::kWords; ++i) h.words[i] = make_uint4(0, 0, 0, 0);
    }
    float v[kChunk];
    Input<T>::unpack(h, v);
    if constexpr (kAdd) {  // h = T(x + residual), written out: the next residual
      if (own < read_chunks) {
        Raw res = reinterpret_cast<const Raw*>(slot + row_bytes)[own];
        float b[kChunk];
        Input<T>::unpack(res, b);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) {
          h.elems[i] = from_float<T>(v[i] + b[i]);
          v[i] = to_float(h.elems[i]);
        }
        add.store(r, own * kChunk, v);
      }
    }
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) ss = fmaf(v[i], v[i], ss);
    const float inv_rms = 1.0f / sqrtf(block_sum(ss, smem) / static_cast<float>(in.cols) + eps);
    // block_sum synchronized the block after every thread read the slot: refill
    // it, the reads (generic proxy) fenced before the copy's writes (async proxy).
    if (threadIdx.x == 0 && j + kRingRows < rows) {
      fence_proxy_async_shared();
      issue(j + kRingRows);
    }
    Raw y_own;
    if (own < write_chunks) y_own = normalize_chunk<T>(h, w_own[0], own * kChunk, weight.cols, inv_rms);
    quantize_row<F, T>([&](auto&& fn) { if (own < write_chunks) fn(own * kChunk, y_own); }, out, r, rule, row_scales,
                       smem);
  }
#endif
}

}  // namespace

namespace {

// The residual kernel's `wave`: the blocks resident at once, where each block
// should ask L2 for the rows one wave ahead; else 0. That pays once x and the
// residual hold 2^24 elements each (32 MiB in bf16) and span four waves or
// more. On an H100 (rms_timeline ROWS HIDDEN add, bf16, us; bench/NOTES.md,
// session 38): 4096 x 4096 59.3 -> 57.6, 16384 x 4096 222.1 -> 205.0,
// 2048 x 8192 82.1 -> 75.1, 8192 x 8192 312.9 -> 279.6; but 2048 x 4096 31.4
// -> 32.4 and 1024 x 8192 even. It is a kernel of its own: with the prefetch
// behind a branch, the residual kernel ran 2-3% slower at decode sizes (1 x
// 4096: 3.57 against 3.45 us), and the plain kernel spilled and ran 5-17%
// slower everywhere (it takes none). fp32 inputs take none either: not
// measured, and the SwiGLU kernel's prefetch lost 16% with them.
template <typename Kernel>
int64_t prefetch_wave(Kernel kernel, DType dtype, int64_t rows, int64_t cols, int threads) {
  if (dtype == DType::kFloat32 || rows * cols < (int64_t{1} << 24)) return 0;
  const int64_t wave = resident_wave(kernel, threads);
  return rows >= 4 * wave ? wave : 0;
}

// The ring kernel's shared memory: kRingRows slots of a row (two with the residual).
constexpr int64_t kRingMaxRowBytes = 16 << 10;  // K = 8192 in 16-bit types, 4096 in fp32
constexpr int kRingMaxSmem = static_cast<int>(kRingRows * 2 * kRingMaxRowBytes);
// Rows from which "auto" takes the ring kernel, in waves of it (see ring_setting).
constexpr int64_t kRingMinWaves = 2;
// With the residual, "auto" takes it only for rows longer than this: where the
// one-row kernel fits one 512-thread block an SM.
constexpr int64_t kRingMinAddRowBytes = 8 << 10;

// Whether the ring kernel can take x: whole 16-byte aligned rows of whole
// chunks that one block holds (chunks <= kThreads), on sm_90.
bool ring_applies(const ConstMatrix& x, const void* residual, int64_t chunks) {
  const int64_t row_bytes = x.cols * element_bytes(x.dtype);
  return current_device_info().hopper() && x.cols > 0 && x.cols % kChunk == 0 && chunks <= kThreads &&
         row_bytes <= kRingMaxRowBytes && aligned(x.data, 16) && (x.row_stride * element_bytes(x.dtype)) % 16 == 0 &&
         (!residual || aligned(residual, 16));
}

// FP8EXT_RMS_RING: "0" never takes the ring kernel, "1" wherever it applies
// (tests, A/B), unset or "auto" for 16-bit inputs from kRingMinWaves waves of
// rows up, with the residual only past kRingMinAddRowBytes a row. Read at each
// launch, so that one process can time both. One process on an H100, bf16, 3
// rounds, us one-row -> ring (ab_quant_env.py, bench/NOTES.md session 43):
// plain 1024 x 4096 12.67 -> 11.98, 8192 x 4096 61.2 -> 54.5, 16384 x 4096
// 116.0 -> 101.3, 8192 x 8192 123.3 -> 114.0; with the residual 2048 x 8192
// 70.9 -> 58.2 and 8192 x 8192 255.6 -> 207.3, but 8192 x 4096 105.0 -> 110.2
// and 16384 x 4096 197.3 -> 217.2 (the ring kernel's 90 registers leave two
// 256-thread blocks an SM there, the one-row kernel three). fp32 is unmeasured.
enum class RingSetting { kNever, kAlways, kAuto };
RingSetting ring_setting() {
  const char* v = std::getenv("FP8EXT_RMS_RING");
  if (v && std::strcmp(v, "0") == 0) return RingSetting::kNever;
  if (v && std::strcmp(v, "1") == 0) return RingSetting::kAlways;
  return RingSetting::kAuto;
}

// Whether "auto" may take the ring kernel, before CUDA is asked for its wave
// (at least a block an SM): decode-sized calls make no driver call for it.
bool ring_may_pay(int64_t rows, int64_t row_bytes, bool add, bool sixteen_bit) {
  return sixteen_bit && (!add || row_bytes > kRingMinAddRowBytes) &&
         rows >= kRingMinWaves * current_device_info().sm_count;
}

template <typename T, Fp8Format F, bool kAdd>
struct RingKernelTag {};  // set_attributes_once's key: E4M3 and E5M2 kernels share a signature

// Launches the ring kernel if the setting wants it for x (`err`: the launch's
// status); false: the caller runs the one-row kernel, also where the ring
// kernel's shared memory cannot be had.
template <typename T, Fp8Format F, bool kAdd>
bool try_ring(const Input<T>& in, const Input<T>& weight, float eps, const Output& out, const ScaleRule& rule,
              float* row_scales, const ResidualAdd<T>& add, int threads, cudaStream_t stream, cudaError_t& err) {
  const RingSetting setting = ring_setting();
  const int64_t row_bytes = in.cols * static_cast<int64_t>(sizeof(T));
  if (setting == RingSetting::kNever ||
      (setting == RingSetting::kAuto && !ring_may_pay(in.rows, row_bytes, kAdd, sizeof(T) == 2)))
    return false;
  const auto kernel = rms_norm_quantize_ring_kernel<T, F, kAdd>;
  if (set_attributes_once<RingKernelTag<T, F, kAdd>>([&] {
        return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingMaxSmem);
      }) != cudaSuccess)
    return false;  // (its error is cleared)
  const int smem = static_cast<int>(kRingRows * (kAdd ? 2 : 1) * row_bytes);
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const int64_t wave = int64_t{per_sm} * current_device_info().sm_count;
  if (wave == 0 || (setting == RingSetting::kAuto && in.rows < kRingMinWaves * wave)) return false;
  err = launch_with_smem(kernel, dim3(static_cast<unsigned>(std::min(in.rows, wave))), dim3(threads),
                         static_cast<size_t>(smem), stream, in, weight, eps, out, rule, row_scales, add);
  return true;
}

cudaError_t launch_rms_norm_quantize(const ConstMatrix& x, const void* residual, void* sum_out, const void* weight,
                                     float eps, const ScaleRule& rule, const Fp8Matrix& q, float* row_scales,
                                     cudaStream_t stream) {
  if (x.rows == 0) return cudaSuccess;
  const int64_t chunks = std::max<int64_t>(1, ceil_div(q.padded_cols, kChunk));
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, round_up(chunks, 32)));
  const Output out = make_output(q);
  const ConstMatrix w{weight, x.dtype, 1, x.cols, x.cols};
  const ConstMatrix res{residual, x.dtype, x.rows, x.cols, x.cols};
  cudaError_t err = cudaSuccess;
  dispatch(x, q.format, [&](auto in, auto fmt) {
    using T = typename decltype(in)::Element;
    constexpr Fp8Format kF = decltype(fmt)::value;
    const dim3 grid(static_cast<unsigned>(x.rows)), block(threads);
    const bool ring = ring_applies(x, residual, chunks);
    if (residual) {
      const ResidualAdd<T> add{make_input<T>(res), static_cast<T*>(sum_out)};
      if (ring && try_ring<T, kF, true>(in, make_input<T>(w), eps, out, rule, row_scales, add, threads, stream, err))
        return;
      const auto prefetching = rms_norm_quantize_kernel<T, kF, true, true>;
      const int64_t wave = prefetch_wave(prefetching, x.dtype, x.rows, x.cols, threads);
      err = launch(wave > 0 ? prefetching : rms_norm_quantize_kernel<T, kF, true>, grid, block, stream, in,
                   make_input<T>(w), eps, out, rule, row_scales, add, wave);
    } else {
      if (ring && try_ring<T, kF, false>(in, make_input<T>(w), eps, out, rule, row_scales, ResidualAdd<T>{}, threads,
                                         stream, err))
        return;
      err = launch(rms_norm_quantize_kernel<T, kF, false>, grid, block, stream, in, make_input<T>(w), eps, out, rule,
                   row_scales, ResidualAdd<T>{}, int64_t{0});
    }
  });
  return err;
}

}  // namespace

cudaError_t rms_norm_quantize_per_row(const ConstMatrix& x, const void* weight, float eps, const ScaleRule& rule,
                                      const Fp8Matrix& q, float* row_scales, cudaStream_t stream) {
  return launch_rms_norm_quantize(x, nullptr, nullptr, weight, eps, rule, q, row_scales, stream);
}

cudaError_t add_rms_norm_quantize_per_row(const ConstMatrix& x, const void* residual, void* sum_out,
                                          const void* weight, float eps, const ScaleRule& rule, const Fp8Matrix& q,
                                          float* row_scales, cudaStream_t stream) {
  // sum_out is written while x and residual are still read (a long row's tail twice): no aliasing.
  if (!residual || !sum_out || sum_out == residual || sum_out == x.data) return cudaErrorInvalidValue;
  return launch_rms_norm_quantize(x, residual, sum_out, weight, eps, rule, q, row_scales, stream);
}

}  // namespace fp8ext::cuda
