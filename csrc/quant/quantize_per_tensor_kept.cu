// Per-tensor current scaling in one launch for large contiguous tensors.
//
// The two-pass path reads the whole tensor twice (amax, then quantize). Here a
// grid of one block per SM splits the flat tensor into contiguous shares (a
// block claims them: see kept_pass_kernel). A block streams its share through a
// ring of shared-memory tiles that the TMA unit fills (cp.async.bulk) and
// reduces its amax; when the share is read, the ring still holds its last
// tiles (224 KB per SM, ~29 MB over the chip). The blocks agree on the amax at
// a grid barrier, then each block quantizes the tiles it kept, which costs no
// second read, and reads the rest of its share again.
//
// Off by default (FP8EXT_QUANT_KEEP, below). 16384 x 8192 bf16 on the H200, one
// process each, 3 rounds against the two passes: with one fixed share per
// block (no claims, which can deadlock beside another stream) 164.9 us against
// 167.8; this version, with claims, 176.1 against 167.9 (its first round
// 168.4), and 23.6 against 24.0 us at 4096 x 4096. Not the claiming itself:
// each block streaming its own share, stealing only unclaimed ones (ffa1fe3),
// also read 176.0 against 167.9 (first round 169.5; bench/NOTES.md, session 18).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "fp8ext/quantize_cuda.h"
#include "quant_common.cuh"
#include "quantize_per_tensor_kept.cuh"
#include "bulk_copy.cuh"

namespace fp8ext::cuda::detail {
namespace {

// 32 warps: the quantizing half is ~7 instructions per element, about as long
// as the memory it waits for, so the SM needs many warps to overlap the two.
constexpr int kThreads = 1024;
constexpr int kRingBytes = 224 * 1024;  // of the 227 KB a block may have
constexpr int kMaxBlocks = 256;         // the grid, so the shares a block may claim

// One 16-element chunk per thread per tile; a chunk is sizeof(T) 16-byte words,
// thread t taking words t, t + kThreads, ...: a warp reads 512 contiguous bytes
// per load, free of bank conflicts.
template <typename T>
constexpr int kWordsPerChunk = Input<T>::kWords;
template <typename T>
constexpr int kElemsPerWord = 16 / static_cast<int>(sizeof(T));
constexpr int64_t kTileElems = int64_t{kThreads} * kChunk;
template <typename T>
constexpr int kTileBytes = static_cast<int>(kTileElems * sizeof(T));
template <typename T>
constexpr int kSlots = kRingBytes / kTileBytes<T>;

// With FP8EXT_QUANT_KEEP=auto: below this many input bytes the two passes win
// (the second reads from L2, and the one-launch kernel's fixed cost shows).
// H200, one process, 3 rounds (ab_quant_env.py --shapes), the version without
// claims: 4096 x 4096 bf16 (32 MiB) 23.78 us against 24.22, 1024 x 4096
// (8 MiB) 10.58 against 10.27, 256 x 4096 11.3% slower.
constexpr int64_t kMinBytes = int64_t{16} << 20;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The tensor's tiles split into `shares` contiguous shares; share s starts at
// tile first(s) (first(shares) = tiles). No share is empty: the grid, and so
// the share count, is at most the tile count.
struct Shares {
  int64_t tiles;
  int shares;
  __device__ int64_t first(int s) const { return tiles * s / shares; }
};
#endif

// The barrier waits for every share to be reduced, not for every block to
// arrive: a block claims shares (an atomic counter) until none is left, so the
// blocks that are running do all the work whatever number of them the GPU
// holds at once (other kernels on other streams may keep some of ours from
// starting; a block that starts after the last claim exits). With the whole
// grid resident, each block claims one share.
//
// Loads are numbered in issue order, pass 1 then pass 2; load k goes to slot
// k % S in that slot's phase k / S. Pass 1 issues the claimed shares' tiles in
// order; its end is a load with no data (a plain arrive: end_load = L) in the
// slot of load L - S, whose tile stays. So after pass 1 the ring holds loads
// L - S .. L - 1, the block's last tiles. Pass 2 takes them as items L + 1 - S
// .. L (item L: the tile of load L - S), then loads L + 1 .. L + R, the other
// R tiles from the last back to the first, each into the slot just freed.
template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kThreads, 1)
    kept_pass_kernel(const T* in, uint8_t* out, int64_t n, ScaleRule rule, float* scale_out, float* workspace) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int S = kSlots<T>;
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ uint64_t full[S];
  __shared__ int64_t slot_tile[S];  // the tile of each slot's latest load
  __shared__ int mine[kMaxBlocks];  // the shares this block claimed, in claim order
  __shared__ int64_t end_load;      // L, written by thread 0 with pass 1's end
  __shared__ int mine_count;
  __shared__ float smem[32];
  __shared__ float grid_amax;
  auto* claims = reinterpret_cast<unsigned*>(&workspace[1]);
  auto* reduced = reinterpret_cast<unsigned*>(&workspace[2]);
  const Shares shares{ceil_div(n, kTileElems), static_cast<int>(gridDim.x)};
  auto tile_elems = [&](int64_t tile) {
    const int64_t rest = n - tile * kTileElems;
    return rest < kTileElems ? rest : kTileElems;
  };
  // Every load streams (evict-first): keeping the tiles before the kept ones in
  // L2 for the backward re-read (evict-normal, 128 KB to 1 MB per block) made
  // 16384 x 8192 bf16 4-10 us slower on the H200, as in the two-pass kernels.
  auto load_tile = [&](int64_t k, int64_t tile) {  // thread 0
    slot_tile[k % S] = tile;
    bulk_load(ring + (k % S) * kTileBytes<T>, in + tile * kTileElems,
              static_cast<uint32_t>(tile_elems(tile) * sizeof(T)), &full[k % S], evict_first_policy());
  };
  // Thread 0's pass-1 cursor: the next tile and the end of its share.
  int64_t cursor = 0, share_end = 0;
  int claimed = 0;
  bool ended = false;
  auto issue_first_pass = [&](int64_t k) {  // thread 0: load k, or pass 1's end
    if (ended) return;
    if (cursor == share_end) {
      const unsigned s = atomicAdd(claims, 1u);
      if (s < static_cast<unsigned>(shares.shares)) {
        mine[claimed++] = static_cast<int>(s);
        cursor = shares.first(static_cast<int>(s));
        share_end = shares.first(static_cast<int>(s) + 1);
      } else {
        ended = true;
        mine_count = claimed;
        end_load = k;
        barrier_arrive(&full[k % S]);
        return;
      }
    }
    load_tile(k, cursor++);
  };
  // The tile of pass-1 load i (thread 0, pass 2): the claimed shares in order.
  auto first_pass_tile = [&](int64_t i) {
    for (int c = 0;; ++c) {
      const int64_t first = shares.first(mine[c]), size = shares.first(mine[c] + 1) - first;
      if (i < size) return first + i;
      i -= size;
    }
  };
  // The 16-byte words of the tile in slot k % S (a partial tile has fewer).
  auto tile_words = [&](int64_t k) { return tile_elems(slot_tile[k % S]) / kElemsPerWord<T>; };
  // This thread's chunk of the tile in slot k % S; words past the tile read as zeros.
  auto read_chunk = [&](int64_t k, int64_t words, float (&v)[kChunk]) {
    const uint4* slot = reinterpret_cast<const uint4*>(ring + (k % S) * kTileBytes<T>);
    typename Input<T>::Raw raw;  // word i holds chunk elements [i * kElemsPerWord, (i + 1) * kElemsPerWord)
#pragma unroll
    for (int i = 0; i < kWordsPerChunk<T>; ++i) {
      const int w = static_cast<int>(threadIdx.x) + i * kThreads;
      raw.words[i] = w < words ? slot[w] : make_uint4(0, 0, 0, 0);
    }
    Input<T>::unpack(raw, v);
  };
  auto wait_slot = [&](int64_t k) { barrier_wait(&full[k % S], static_cast<uint32_t>(k / S) & 1u); };

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) barrier_init(&full[s]);
    fence_barrier_init();
    end_load = INT64_MAX;
  }
  __syncthreads();
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): the input and the workspace come from kernels before
  if (threadIdx.x == 0)
    for (int64_t k = 0; k < S; ++k) issue_first_pass(k);

  float amax = 0.0f;
  int64_t last = 0;  // L
  for (int64_t k = 0;; ++k) {
    wait_slot(k);
    if (k == *reinterpret_cast<volatile int64_t*>(&end_load)) {  // set before the arrive that ended the wait
      last = k;
      break;
    }
    float v[kChunk];
    read_chunk(k, tile_words(k), v);
    amax = fmaxf(amax, chunk_amax(v));
    __syncthreads();  // every thread has read slot k % S (generic proxy): fenced before the refill's
    if (threadIdx.x == 0) {  // writes (async proxy), as in the RMSNorm ring kernel
      fence_proxy_async_shared();
      issue_first_pass(k + S);
    }
  }
  __syncthreads();  // mine_count, mine[] written before pass 1's end
  if (mine_count == 0) return;  // started after the last claim

  // Grid barrier: each block adds its amax, then the count of shares it reduced.
  amax = block_max(amax, smem);
  if (threadIdx.x == 0) {
    atomic_max_nonneg(&workspace[0], amax);
    __threadfence();  // the amax is visible before the count
    atomicAdd(reduced, static_cast<unsigned>(mine_count));
    while (load_acquire(reduced) < static_cast<unsigned>(shares.shares)) __nanosleep(32);
    grid_amax = __uint_as_float(load_acquire(reinterpret_cast<const unsigned*>(&workspace[0])));
  }
  __syncthreads();
  const float s = scale_from_amax(grid_amax, rule);
  if (threadIdx.x == 0 && mine[0] == 0) *scale_out = s;  // the block that claimed share 0 (block 0 may have none)
  const Scale scale(s);

  const int64_t kept = last < S ? last : S, again = last - kept;  // R = again
  for (int64_t j = last < S ? 0 : last + 1 - S; j <= last + again; ++j) {
    if (j == last && last < S) continue;  // no load L - S: the end took an empty slot
    wait_slot(j);
    const int64_t words = tile_words(j);
    float v[kChunk];
    read_chunk(j, words, v);
    const Codes q = quantize_chunk<F>(v, scale);
    uint8_t* dst = out + slot_tile[j % S] * kTileElems;
#pragma unroll
    for (int i = 0; i < kWordsPerChunk<T>; ++i) {  // word i's codes: kElemsPerWord bytes
      const int w = static_cast<int>(threadIdx.x) + i * kThreads;
      if (w >= words) break;
      if constexpr (kElemsPerWord<T> == 8)
        __stcs(reinterpret_cast<uint2*>(dst) + w, make_uint2(q.words[2 * i], q.words[2 * i + 1]));
      else
        __stcs(reinterpret_cast<unsigned*>(dst) + w, q.words[i]);
    }
    if (j + S <= last + again) {  // load j + S: the re-read of pass-1 load L - S - 1 - (j + S - L - 1)
      __syncthreads();
      if (threadIdx.x == 0) {
        fence_proxy_async_shared();
        load_tile(j + S, first_pass_tile(last - kept - 1 - (j + S - last - 1)));
      }
    }
  }
#else
  __trap();  // never launched below sm_90 (see per_tensor_fits_kept_pass)
#endif
}

template <typename T, Fp8Format F>
cudaError_t launch_kept_pass(const T* in, uint8_t* out, int64_t n, const ScaleRule& rule, float* scale_out,
                             float* workspace, cudaStream_t stream) {
  auto* kernel = kept_pass_kernel<T, F>;
  constexpr int kSmem = kSlots<T> * kTileBytes<T>;
  // At every launch (the device may have changed): cheap, and not a stream operation, so allowed under capture.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const int64_t tiles = ceil_div(n, kTileElems);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>({int64_t{num_sms()}, tiles, int64_t{kMaxBlocks}})));
  // A plain launch (with PDL): the barrier needs no block to be resident but
  // the ones running (see kept_pass_kernel). A cooperative launch, which would
  // keep the whole grid resident, cost ~10 us a call (176 us against 165 at
  // 16384 x 8192 bf16, H200).
  return launch_with_smem(kernel, grid, dim3(kThreads), kSmem, stream, in, out, n, rule, scale_out, workspace);
}

// FP8EXT_QUANT_KEEP: "1" takes the kept-share kernel at any size (tests, A/B),
// "auto" from kMinBytes up; unset or "0": never (see the top of this file).
bool kept_pass_wanted(int64_t bytes) {
  const char* v = std::getenv("FP8EXT_QUANT_KEEP");
  if (v && std::strcmp(v, "1") == 0) return true;
  if (v && std::strcmp(v, "auto") == 0) return bytes >= kMinBytes;
  return false;
}

}  // namespace

bool per_tensor_fits_kept_pass(const ConstMatrix& x, const Fp8Matrix& q) {
  const int64_t n = x.rows * x.cols;
  const int64_t elem = element_bytes(x.dtype);
  return n > 0 && current_device_info().hopper() && kept_pass_wanted(n * elem) &&
         (x.rows <= 1 || x.row_stride == x.cols) && q.padded_cols == q.cols && (n * elem) % 16 == 0 &&
         aligned(x.data, 16) && aligned(q.data, 16);
}

cudaError_t quantize_per_tensor_kept(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                                     float* scale_out, float* amax_workspace, cudaStream_t stream) {
  static_assert(kAmaxWorkspaceFloats >= 3, "the amax, the shares claimed, the shares reduced");
  const int64_t n = x.rows * x.cols;
  cudaError_t err = cudaSuccess;
  dispatch(x, q.format, [&](auto in, auto fmt) {
    using T = typename decltype(in)::Element;
    err = launch_kept_pass<T, decltype(fmt)::value>(in.data, q.data, n, rule, scale_out, amax_workspace, stream);
  });
  return err;
}

}  // namespace fp8ext::cuda::detail
