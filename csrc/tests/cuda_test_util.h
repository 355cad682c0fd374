// Helpers shared by the CUDA harness tests: skip without a GPU, check a CUDA
// call, and a device buffer that uploads/downloads std::vectors.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "harness.h"

namespace fp8ext::test {

inline void require_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) skip("no CUDA device");
}

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n;
  explicit DeviceBuffer(size_t count) : n(count) { cudaMalloc(&ptr, std::max<size_t>(1, n) * sizeof(T)); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& v) { cudaMemcpy(ptr, v.data(), n * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

}  // namespace fp8ext::test

#define CUDA_OK(expr) EXPECT_EQ_CTX(int(expr), int(cudaSuccess), #expr)
