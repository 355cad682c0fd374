// Helpers shared by the CUDA harness tests: skip without a GPU, check a CUDA
// call, and a device buffer that uploads/downloads std::vectors.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "harness.h"

namespace fp8ext::test {

inline void require_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) skip("no CUDA device");
}

// SMs of device 0, or an H200's 132 without a GPU (what the dispatchers assume
// then): the host-side dispatch tests whose cases depend on it.
inline int sm_count_or_h200() {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess || sms <= 0) {
    (void)cudaGetLastError();
    return 132;
  }
  return sms;
}

// A test cannot go on without its buffers: a failed allocation or copy ends the
// program with the CUDA error (a kernel fault surfaces here too, at the next copy).
inline void require_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  std::fprintf(stderr, "%s: CUDA error: %s\n", what, cudaGetErrorString(err));
  std::exit(1);
}

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n;
  explicit DeviceBuffer(size_t count) : n(count) {
    require_cuda(cudaMalloc(&ptr, std::max<size_t>(1, n) * sizeof(T)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& v) {
    require_cuda(cudaMemcpy(ptr, v.data(), n * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> v(n);
    require_cuda(cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return v;
  }
};

}  // namespace fp8ext::test

#define CUDA_OK(expr) EXPECT_EQ_CTX(int(expr), int(cudaSuccess), #expr)
