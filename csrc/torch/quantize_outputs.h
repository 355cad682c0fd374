// Output allocation for the quantize ops, shared by every backend so that
// shapes and strides agree (the Python fake implementations mirror these).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "fp8ext/types.h"

namespace fp8ext::torch_ops {

// q: [rows, round_up(cols, pad_k_to)] in the FP8 dtype.
inline at::Tensor new_fp8_output(const at::Tensor& x, at::ScalarType dtype, int64_t cols_padded) {
  return at::empty({x.size(0), cols_padded}, x.options().dtype(dtype));
}

inline at::Tensor new_scalar_scale(const at::Tensor& x) {
  return at::empty({}, x.options().dtype(at::kFloat));
}

inline at::Tensor new_row_scales(const at::Tensor& x) {
  return at::empty({x.size(0)}, x.options().dtype(at::kFloat));
}

// Logical [rows, ceil(cols/128)], M-major: stride (1, round_up(rows, 4)).
// The storage holds the padded rows too (every backend writes them as zeros) so a
// TMA box never reads past it.
inline at::Tensor new_group_scales(const at::Tensor& x) {
  const int64_t rows = x.size(0);
  const int64_t groups = ceil_div(x.size(1), kGroupSize);
  const int64_t padded_rows = round_up(rows, kGroupScaleRowAlign);
  at::Tensor storage = at::empty({groups, padded_rows}, x.options().dtype(at::kFloat));  // kernels write the padding
  return storage.as_strided({rows, groups}, {1, padded_rows});
}

inline at::Tensor new_block_scales(const at::Tensor& x) {
  return at::empty({ceil_div(x.size(0), kGroupSize), ceil_div(x.size(1), kGroupSize)},
                   x.options().dtype(at::kFloat));
}

}  // namespace fp8ext::torch_ops
