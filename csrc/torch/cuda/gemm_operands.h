// Operands as the CUTLASS GEMMs need them (shared by scaled_mm_cuda.cpp and
// blockwise_mm_cuda.cpp): what is already usable passes through, anything else
// is copied into a zero-padded buffer (the documented cost of the padded path).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace fp8ext::torch_ops {

inline bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// An FP8 operand [rows, K] with exactly `rows_padded` rows and `k_padded`
// columns: K contiguous, row stride a multiple of 16, 16-byte aligned.
inline at::Tensor kernel_operand(const at::Tensor& x, int64_t k_padded, int64_t rows_padded) {
  const bool usable = x.size(0) == rows_padded && x.size(1) == k_padded && (x.size(1) <= 1 || x.stride(1) == 1) &&
                      (x.size(0) <= 1 || (x.stride(0) >= k_padded && x.stride(0) % 16 == 0)) && aligned16(x);
  if (usable) return x;
  at::Tensor padded = at::zeros({rows_padded, k_padded}, x.options());
  padded.narrow(0, 0, x.size(0)).narrow(1, 0, x.size(1)).copy_(x);
  return padded;
}

// A vector padded with zeros to `length` (contiguous, 16-byte aligned), or the
// tensor itself when it already is one.
inline at::Tensor padded_vector(const at::Tensor& v, int64_t length) {
  if (v.numel() == length && v.is_contiguous() && aligned16(v)) return v;
  at::Tensor out = at::zeros({length}, v.options());
  out.narrow(0, 0, v.numel()).copy_(v.reshape({-1}));
  return out;
}

}  // namespace fp8ext::torch_ops
