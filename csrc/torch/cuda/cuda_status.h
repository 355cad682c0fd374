// One way for the CUDA ops to turn a kernel library status into a Python error.
#pragma once

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

namespace fp8ext::torch_ops {

// Raises RuntimeError naming `what` when `err` is not cudaSuccess. A failed
// launch also leaves the error in the runtime's last-error slot, where the
// next, unrelated PyTorch launch check would report it as its own: clear it.
inline void check_cuda_status(cudaError_t err, const char* what) {
  if (err != cudaSuccess) (void)cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, what, ": CUDA error: ", cudaGetErrorString(err));
}

}  // namespace fp8ext::torch_ops
