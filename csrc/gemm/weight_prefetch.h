// How the decode-sized (swap-AB) CUTLASS GEMMs can start their weight stream
// before the kernel's PDL wait (host side; the device side is
// sm90_weight_prefetch.cuh).
//
// At M <= 64 a GEMM is a stream of its weight, and a few microseconds of each
// call are not streaming: the wait for the kernel before (PDL), the first
// bytes, the tail. The weight does not depend on the kernel before, so before
// that wait each CTA can ask L2 for the weight rows it will read first (within
// a budget over the whole grid) and let the next kernel launch at once.
// Measured on the H200 (bench/NOTES.md, session 16), one process:
// - behind a short kernel that leaves DRAM idle (the activation quantization
//   before each FP8Linear GEMM: bench_linear's stack at M = 16), 4 MiB took the
//   stack from 83.2 to 80.7 us (per-tensor) and 82.0 to 80.1 (row-wise); 8 MiB
//   80.4-81.1; M = 128 does not take this path;
// - between two GEMMs, where DRAM is busy anyway: 16 MiB made 16x4096x4096
//   7.60 -> 8.39 us; 1-8 MiB moved rows by +-0.5 us, and block-wise rows lost
//   0.3-0.5 us at 4 MiB.
// So the per-tensor/row-wise kernels prefetch 4 MiB by default and the
// block-wise ones nothing. The early launch gained nothing and is off.
// Both are hints: correctness never depends on them (see prefetch_l2 and
// allow_next_kernel_launch in fp8ext/cuda_launch.h; test_pdl_cuda.py checks
// that every setting gives the same bits).
#pragma once

#include <cstdint>
#include <cstdlib>

namespace fp8ext::cuda::gemm {

struct WeightPrefetchPolicy {
  int64_t budget_bytes;  // weight bytes the whole grid prefetches before its PDL wait
  bool early_launch;     // let the next kernel launch before this one waits
};

// Read at each launch (a CUDA graph keeps what was set when it was captured),
// for A/B timing in one process: FP8EXT_GEMM_PREFETCH_MB (MiB of weight over
// the grid, 0 = none, at most 64 GiB; unset: default_budget_mib) and
// FP8EXT_EARLY_LAUNCH=1.
inline WeightPrefetchPolicy weight_prefetch_policy(int64_t default_budget_mib) {
  constexpr int64_t kMaxBudgetMiB = int64_t{1} << 16;
  const char* mb = std::getenv("FP8EXT_GEMM_PREFETCH_MB");
  const char* early = std::getenv("FP8EXT_EARLY_LAUNCH");
  int64_t budget_mib = mb && *mb ? std::atoll(mb) : default_budget_mib;
  budget_mib = budget_mib < 0 ? 0 : budget_mib > kMaxBudgetMiB ? kMaxBudgetMiB : budget_mib;
  return {budget_mib << 20, early && early[0] == '1' && early[1] == '\0'};
}

}  // namespace fp8ext::cuda::gemm
