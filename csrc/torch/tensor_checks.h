// Argument checks shared by the op implementations, and conversion of tensors to
// the kernel library's plain views. Errors name the argument and what was expected:
// TORCH_CHECK_TYPE -> TypeError, TORCH_CHECK_VALUE -> ValueError in Python.
#pragma once

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <utility>

#include "fp8ext/scaling.h"
#include "fp8ext/types.h"

namespace fp8ext::torch_ops {

inline DType to_dtype(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default:
      TORCH_CHECK_TYPE(false, name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
  }
}

inline Fp8Format to_fp8_format(at::ScalarType s, const char* name) {
  if (s == at::kFloat8_e4m3fn) return Fp8Format::kE4M3;
  if (s == at::kFloat8_e5m2) return Fp8Format::kE5M2;
  TORCH_CHECK_TYPE(false, name, " must be torch.float8_e4m3fn or torch.float8_e5m2, got ", s);
}

// A 2-D input whose last dimension is contiguous (rows may be strided).
inline ConstMatrix input_matrix(const at::Tensor& x, const char* name) {
  TORCH_CHECK_VALUE(x.dim() == 2, name, " must be 2-D [rows, cols], got ", x.dim(), "-D");
  const DType dt = to_dtype(x, name);
  TORCH_CHECK_VALUE(x.size(1) <= 1 || x.stride(1) == 1, name,
                    " must have a contiguous last dimension (stride 1), got strides ", x.strides());
  TORCH_CHECK_VALUE(x.size(0) <= 1 || x.stride(0) >= x.size(1), name,
                    " rows must not overlap, got strides ", x.strides());
  return ConstMatrix{x.data_ptr(), dt, x.size(0), x.size(1), x.size(0) <= 1 ? x.size(1) : x.stride(0)};
}

// pad_k_to is an alignment; the bound (python/fp8ext/ops/quantize_checks.py's MAX_PAD_K_TO)
// keeps cols rounded up to it far from int64 overflow.
inline constexpr int64_t kMaxPadKTo = int64_t{1} << 20;

inline int64_t padded_cols(int64_t cols, int64_t pad_k_to) {
  TORCH_CHECK_VALUE(pad_k_to >= 0 && pad_k_to <= kMaxPadKTo, "pad_k_to must be in [0, ", kMaxPadKTo,
                    "] (0 or 1: no padding), got ", pad_k_to);
  return pad_k_to > 1 ? round_up(cols, pad_k_to) : cols;
}

inline Fp8Matrix output_matrix(const at::Tensor& q, Fp8Format f, int64_t cols) {
  return Fp8Matrix{static_cast<uint8_t*>(q.data_ptr()), f, q.size(0), cols, q.size(1)};
}

inline ScaleRule scale_rule(at::ScalarType dtype, int64_t margin, bool power_of_two) {
  TORCH_CHECK_VALUE(margin >= -64 && margin <= 64, "margin must be in [-64, 64], got ", margin);
  return ScaleRule{to_fp8_format(dtype, "dtype"), static_cast<int>(margin), power_of_two};
}

inline void check_scalar_fp32(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.numel() == 1, name, " must hold one value (0-d), got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.device() == like.device(), name, " must be on ", like.device(), ", got ",
                    t.device());
}

inline void check_amax_history(const at::Tensor& h, const at::Tensor& x) {
  TORCH_CHECK_TYPE(h.scalar_type() == at::kFloat, "amax_history must be float32, got ", h.scalar_type());
  TORCH_CHECK_VALUE(h.dim() == 1 && h.numel() >= 1 && h.is_contiguous(),
                    "amax_history must be a contiguous 1-D tensor of length >= 1, got shape ", h.sizes());
  TORCH_CHECK_VALUE(h.device() == x.device(), "amax_history must be on ", x.device());
}

// Two tensors an op writes one of (or both) must not share memory: the kernels
// read and write them in an order that assumes they are apart.
// Beyond what at::get_overlap_status decides ("too hard" for a row-strided x),
// the bytes the two span are compared when they share a storage.
inline bool spans_intersect(const at::Tensor& a, const at::Tensor& b) {
  auto span = [](const at::Tensor& t) {
    int64_t last = 0;  // offset of the last element, in elements (strides are >= 0 here)
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    const auto* p = static_cast<const char*>(t.data_ptr());
    return std::pair{p, p + (last + 1) * static_cast<int64_t>(t.element_size())};
  };
  const auto [a0, a1] = span(a);
  const auto [b0, b1] = span(b);
  return a0 < b1 && b0 < a1;
}

inline void check_no_overlap(const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name) {
  const at::MemOverlapStatus status = at::get_overlap_status(a, b);
  const bool overlap = status == at::MemOverlapStatus::Full || status == at::MemOverlapStatus::Partial ||
                       (status == at::MemOverlapStatus::TooHard && a.storage().is_alias_of(b.storage()) &&
                        spans_intersect(a, b));
  TORCH_CHECK_VALUE(!overlap, a_name, " and ", b_name, " must not overlap in memory");
}

// quantize_delayed writes amax_history and scale (after every block has read
// scale): a scale inside the history, or either inside x, gives wrong codes.
inline void check_delayed_state_apart(const at::Tensor& x, const at::Tensor& amax_history, const at::Tensor& scale) {
  check_no_overlap(amax_history, "amax_history", scale, "scale");
  check_no_overlap(x, "x", amax_history, "amax_history");
  check_no_overlap(x, "x", scale, "scale");
}

}  // namespace fp8ext::torch_ops
