// One-pass per-tensor current scaling for small tensors: a cluster of 8 blocks
// (sm_90) holds the whole tensor in registers, each block reduces its amax, the
// blocks exchange them through distributed shared memory, and every thread
// quantizes what it holds. One launch, no workspace, the input read once; the
// two-pass path costs a memset and two launches, which dominate at decode sizes.
#include <cooperative_groups.h>

#include "fp8ext/quantize_cuda.h"
#include "quant_common.cuh"
#include "quantize_per_tensor_small.cuh"

namespace fp8ext::cuda::detail {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kClusterBlocks = 8;  // the portable cluster size
constexpr int kChunksPerThread = 2;
constexpr int64_t kMaxChunks = int64_t{kClusterBlocks} * kThreads * kChunksPerThread;
static_assert(kMaxChunks * kChunk == kOnePassMaxElements, "capacity and the documented limit disagree");

template <typename T, Fp8Format F>
__global__ void __launch_bounds__(kThreads)
    one_pass_kernel(Input<T> in, Output out, int chunks_per_row, int total_chunks, ScaleRule rule, float* scale_out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ float smem[32];
  __shared__ float block_amax;
  begin_dependent_kernel();  // PDL (fp8ext/cuda_launch.h): nothing in memory is touched before this
  cg::cluster_group cluster = cg::this_cluster();
  int row[kChunksPerThread], col[kChunksPerThread];
  typename Input<T>::Raw raw[kChunksPerThread] = {};
#pragma unroll
  for (int k = 0; k < kChunksPerThread; ++k) {  // all loads first, so they are in flight together
    const int i = (k * kClusterBlocks + static_cast<int>(blockIdx.x)) * kThreads + static_cast<int>(threadIdx.x);
    row[k] = i < total_chunks ? i / chunks_per_row : -1;
    col[k] = (i - row[k] * chunks_per_row) * kChunk;
    if (row[k] >= 0) in.load_raw(row[k], col[k], raw[k]);
  }
  float amax = raw_chunks_amax<T>(raw);  // chunks past the end hold zeros
  amax = block_max(amax, smem);
  if (threadIdx.x == 0) block_amax = amax;
  cluster.sync();  // every block's amax is published
  float total = 0.0f;
#pragma unroll
  for (int b = 0; b < kClusterBlocks; ++b) total = fmaxf(total, *cluster.map_shared_rank(&block_amax, b));
  cluster.sync();  // no block leaves while another still reads its shared memory
  const float s = scale_from_amax(total, rule);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_out = s;
  const Scale scale(s);
#pragma unroll
  for (int k = 0; k < kChunksPerThread; ++k) {
    if (row[k] < 0) continue;
    float v[kChunk];
    in.unpack(raw[k], v);
    out.store(row[k], col[k], quantize_chunk<F>(v, scale));
  }
#else
  __trap();  // never launched below sm_90 (see per_tensor_fits_one_pass)
#endif
}

}  // namespace

bool per_tensor_fits_one_pass(const ConstMatrix& x, const Fp8Matrix& q) {
  return x.rows * ceil_div(q.padded_cols, kChunk) <= kMaxChunks && current_device_info().hopper();
}

cudaError_t quantize_per_tensor_one_pass(const ConstMatrix& x, const ScaleRule& rule, const Fp8Matrix& q,
                                         float* scale_out, cudaStream_t stream) {
  const int chunks_per_row = static_cast<int>(ceil_div(q.padded_cols, kChunk));
  const int total_chunks = static_cast<int>(q.rows) * chunks_per_row;
  const Output out = make_output(q);
  cudaError_t err = cudaSuccess;
  dispatch(x, q.format, [&](auto in, auto fmt) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(kClusterBlocks);
    config.blockDim = dim3(kThreads);
    config.stream = stream;
    cudaLaunchAttribute attrs[2];
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = kClusterBlocks;
    attrs[0].val.clusterDim.y = 1;
    attrs[0].val.clusterDim.z = 1;
    config.attrs = attrs;
    config.numAttrs = 1 + pdl_attribute(attrs[1]);
    err = cudaLaunchKernelEx(&config, one_pass_kernel<typename decltype(in)::Element, decltype(fmt)::value>, in, out,
                             chunks_per_row, total_chunks, rule, scale_out);
  });
  return err;
}

}  // namespace fp8ext::cuda::detail
