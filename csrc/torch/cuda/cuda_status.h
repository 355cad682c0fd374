// One way for the CUDA ops to turn a kernel library status into a Python error,
// and the GPU-generation check the sm_80+ kernels share.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include "fp8ext/scaled_mm.h"

namespace fp8ext::torch_ops {

// Raises RuntimeError naming `what` when `err` is not cudaSuccess. A failed
// launch also leaves the error in the runtime's last-error slot, where the
// next, unrelated PyTorch launch check would report it as its own: clear it.
inline void check_cuda_status(cudaError_t err, const char* what) {
  if (err != cudaSuccess) (void)cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, what, ": CUDA error: ", cudaGetErrorString(err));
}

// The GEMM ops' launch check: a launch CUDA refused inside CUTLASS comes back
// without its reason (fp8ext/scaled_mm.h, kGemmLaunchRefused); say what
// usually causes it rather than "unknown error" alone.
inline void check_gemm_status(cudaError_t err, const char* what) {
  if (err == fp8ext::cuda::kGemmLaunchRefused) {
    (void)cudaGetLastError();
    TORCH_CHECK(false, what, ": CUDA refused the CUTLASS kernel's launch and CUTLASS cleared the reason (usual "
                "causes: a stream capture that forbids it, thread-block clusters unavailable, e.g. under MPS, or "
                "a build without this GPU's code)");
  }
  check_cuda_status(err, what);
}

// The quantization and KV-cache kernels are built for the configured archs plus
// compute_80 PTX, so they run (JIT-compiled where needed) on any GPU from sm_80
// up; an older GPU gets this refusal instead of "no kernel image is available".
inline void check_sm80_or_newer(const at::Tensor& t, const char* name, const char* kernels) {
  TORCH_CHECK_VALUE(t.is_cuda(), name, " must be a CUDA tensor, got ", t.device());
  int major = 0;
  check_cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, t.get_device()),
                    "device query");
  TORCH_CHECK(major >= 8, "fp8ext: the CUDA ", kernels, " kernels need compute capability >= 8.0, got ", major, ".x");
}

}  // namespace fp8ext::torch_ops
