// The shape, stride and alignment rules both sm_90a GEMM families share (the
// TMA loads A and B and stores D in whole 16 bytes), as one check.
#pragma once

#include <cstdint>

#include "fp8ext/types.h"

namespace fp8ext::cuda {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// nullptr when A [m, k] (row stride lda), B [n, k] (ldb) and D [m, n] (ldd, dtype d)
// can go to the kernels as they are; else why not.
inline const char* tma_gemm_unsupported_reason(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                                               int64_t ldd, DType d, const void* a, const void* b, const void* out,
                                               const void* bias) {
  if (m <= 0 || n <= 0 || k <= 0) return "M, N and K must be positive";
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return "M, N and K must fit in 32 bits";
  if (k % 16 != 0) return "K must be a multiple of 16 (pad it with zeros)";
  if (lda < k || ldb < k || lda % 16 != 0 || ldb % 16 != 0)
    return "the row strides of A and B must be multiples of 16 and at least K";
  if ((n * element_bytes(d)) % 16 != 0)
    return "N must be a multiple of 16 bytes of D (8 for bf16/fp16, 4 for fp32): pad B's rows";
  if (ldd < n || (ldd * element_bytes(d)) % 16 != 0)
    return "the row stride of D must be at least N and a multiple of 16 bytes";
  if (!aligned16(a) || !aligned16(b) || !aligned16(out) || (bias && !aligned16(bias)))
    return "A, B, D and the bias must start 16-byte aligned";
  return nullptr;
}

}  // namespace fp8ext::cuda
