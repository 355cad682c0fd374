// What the two CUDA GEMM ops (scaled_mm_cuda.cpp, blockwise_mm_cuda.cpp) share:
// their common argument checks, and operands as the CUTLASS kernels need them
// (what is already usable passes through, anything else is copied into a
// zero-padded buffer: the documented cost of the padded path).
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "cuda_status.h"
#include "fp8ext/padded_copy.h"

namespace fp8ext::torch_ops {

// a [M, K] and b [N, K] on one CUDA device, and the output dtype.
inline void check_gemm_operands(const at::Tensor& a, const at::Tensor& b, at::ScalarType out_dtype) {
  TORCH_CHECK_VALUE(a.dim() == 2 && b.dim() == 2, "a and b must be 2-D ([M, K] and [N, K]), got ", a.dim(),
                    "-D and ", b.dim(), "-D");
  TORCH_CHECK_VALUE(a.is_cuda() && b.device() == a.device(), "a and b must be on the same CUDA device, got ",
                    a.device(), " and ", b.device());
  TORCH_CHECK_VALUE(a.size(1) == b.size(1), "a and b must share K (a: [M, K], b: [N, K]), got ", a.sizes(),
                    " and ", b.sizes());
  TORCH_CHECK_TYPE(out_dtype == at::kBFloat16 || out_dtype == at::kHalf || out_dtype == at::kFloat,
                   "out_dtype must be bfloat16, float16 or float32, got ", out_dtype);
}

// The bias ([N] in out_dtype, on a's device), and a GPU the sm_90a kernels run on.
inline void check_bias_and_gpu(const std::optional<at::Tensor>& bias, int64_t n, at::ScalarType out_dtype,
                               const at::Tensor& a, const char* op) {
  if (bias) {
    TORCH_CHECK_TYPE(bias->scalar_type() == out_dtype, "bias must have out_dtype (", out_dtype, "), got ",
                     bias->scalar_type());
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == n && bias->device() == a.device(),
                      "bias must be [N] = [", n, "] on ", a.device(), ", got ", bias->sizes(), " on ",
                      bias->device());
  }
  int major = 0;
  check_cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, a.get_device()), op);
  TORCH_CHECK(major == 9, op, ": the CUTLASS kernels are built for sm_90a (H100/H200), this GPU is sm_", major,
              "x; fp8ext.scaled_mm runs the PyTorch reference there");
}

inline bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// dst [rows', cols'] = src [rows, cols] with zeros past src's rows and
// columns (dst no smaller than src: a padded operand or vector, 16-byte
// aligned rows): one pass of cuda::copy_zero_padded over dst. A src whose rows
// are not contiguous (a transposed view) is zero-filled and copied by torch.
inline void copy_zero_padded(const at::Tensor& src, const at::Tensor& dst) {
  if (src.size(1) > 1 && src.stride(1) != 1) {
    dst.zero_();
    dst.narrow(0, 0, src.size(0)).narrow(1, 0, src.size(1)).copy_(src);
    return;
  }
  const int64_t bytes = static_cast<int64_t>(src.element_size());
  check_cuda_status(cuda::copy_zero_padded(src.data_ptr(), src.size(0), src.size(1) * bytes, src.stride(0) * bytes,
                                           dst.data_ptr(), dst.size(0), dst.size(1) * bytes, dst.stride(0) * bytes,
                                           c10::cuda::getCurrentCUDAStream()),
                    "fp8ext: copying an operand into its padded buffer");
}

// An FP8 operand [rows, K] with exactly `rows_padded` rows and `k_padded`
// columns: K contiguous, row stride a multiple of 16, 16-byte aligned.
inline at::Tensor kernel_operand(const at::Tensor& x, int64_t k_padded, int64_t rows_padded) {
  const bool usable = x.size(0) == rows_padded && x.size(1) == k_padded && (x.size(1) <= 1 || x.stride(1) == 1) &&
                      (x.size(0) <= 1 || (x.stride(0) >= k_padded && x.stride(0) % 16 == 0)) && aligned16(x);
  if (usable) return x;
  at::Tensor padded = at::empty({rows_padded, k_padded}, x.options());
  copy_zero_padded(x, padded);
  return padded;
}

// A vector padded with zeros to `length` (contiguous, 16-byte aligned), or the
// tensor itself when it already is one.
inline at::Tensor padded_vector(const at::Tensor& v, int64_t length) {
  if (v.numel() == length && v.is_contiguous() && aligned16(v)) return v;
  at::Tensor out = at::empty({length}, v.options());
  copy_zero_padded(v.reshape({1, -1}), out.view({1, length}));
  return out;
}

}  // namespace fp8ext::torch_ops
