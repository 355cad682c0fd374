// Shared by the device timing tools (decode_timeline.cu, silu_timeline.cu, rms_timeline.cu):
// a fatal CUDA check, the graph-replay timer, an input fill and the output hash that tells
// whether two builds computed the same bits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                               \
  do {                                                                                         \
    cudaError_t err_ = (x);                                                                    \
    if (err_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

// us a call of `enqueue(stream)`: `calls` of them captured back to back in one
// graph, replayed `replays` times after one warm-up replay.
template <class Enqueue>
double graph_us_per_call(cudaStream_t stream, int calls, int replays, Enqueue&& enqueue) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < calls; ++i) CHECK(enqueue(stream));
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, stream));  // warm-up
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start, stream));
  for (int r = 0; r < replays; ++r) CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaEventRecord(stop, stream));
  CHECK(cudaStreamSynchronize(stream));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  return 1e3 * ms / (double(replays) * calls);
}

// Pseudo-random inputs in about +-4: bf16 as bytes (high byte 0x3F/0x40 or
// their negatives), fp32 as a hash mapped to [-4, 4). `salt` tells buffers apart.
__global__ void fill_inputs(void* p, size_t n, bool fp32, uint32_t salt = 0) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = (static_cast<uint32_t>(i) ^ salt) * 2654435761u;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    if (fp32) static_cast<float*>(p)[i] = (h >> 8) * (8.0f / 16777216.0f) - 4.0f;
    else static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>((h & 0x807F) | (h & 0x100 ? 0x4000 : 0x3F80));
  }
}

// FNV-1a of some bytes: equal across versions that compute the same thing.
inline uint64_t fnv1a(const std::vector<uint8_t>& bytes) {
  uint64_t hash = 1469598103934665603ull;
  for (uint8_t byte : bytes) hash = (hash ^ byte) * 1099511628211ull;
  return hash;
}
