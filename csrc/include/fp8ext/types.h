// Plain types of the torch-free kernel library: element types and 2-D views
// described by pointer, shape and row stride (in elements).
//
// Every launcher of the library (scaled_mm.h, quantize_cuda.h, paged_kv_cuda.h, ...)
// runs on the current CUDA device: the stream and the pointers it is given must
// belong to it (SM count, shared-memory opt-ins and workspace sizes are that
// device's). The torch ops set the device from their tensors.
#pragma once

#include <cstdint>

#include "fp8ext/fp8_format.h"

namespace fp8ext {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline int64_t element_bytes(DType d) { return d == DType::kFloat32 ? 4 : 2; }

// A read-only row-major matrix whose rows may be padded (row_stride >= cols).
struct ConstMatrix {
  const void* data;
  DType dtype;
  int64_t rows;
  int64_t cols;
  int64_t row_stride;
};

// An FP8 output matrix [rows, padded_cols]; columns [cols, padded_cols) are
// written as zeros so a GEMM can read a K padded to its alignment.
struct Fp8Matrix {
  uint8_t* data;
  Fp8Format format;
  int64_t rows;
  int64_t cols;
  int64_t padded_cols;  // also the row stride
};

// Scale layouts the GEMMs consume without a copy.
constexpr int64_t kGroupSize = 128;  // 1x128 activation groups, 128x128 weight blocks
constexpr int64_t kGroupScaleRowAlign = 4;  // M-major group scales: M padded to a multiple of 4 (16 B for TMA)

FP8EXT_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
FP8EXT_HD int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

}  // namespace fp8ext
