// How the decode-sized (swap-AB) CUTLASS GEMMs start their weight stream early
// (host side; the device side is sm90_weight_prefetch.cuh).
//
// At M <= 64 a GEMM is a stream of its weight, and a few microseconds of each
// call are ramp: the kernel waits for the kernel before (PDL), then its loads
// fill the pipe. The weight does not depend on the kernel before, so before
// that wait each block asks L2 for the weight rows it will read first (up to
// a budget over the whole grid, so that the lines are still in L2 when read),
// and lets the next kernel in the stream launch at once instead of at its end.
// A chain of GEMMs (or norm, GEMM, attention, ...) then keeps DRAM busy
// across kernel boundaries. Both are hints: correctness never depends on them
// (see prefetch_l2 and allow_next_kernel_launch in fp8ext/cuda_launch.h).
#pragma once

#include <cstdint>
#include <cstdlib>

namespace fp8ext::cuda::gemm {

struct WeightPrefetchPolicy {
  int64_t budget_bytes;  // weight bytes the whole grid prefetches before its PDL wait
  bool early_launch;     // let the next kernel launch before this one waits
};

// Defaults, overridable for A/B timing (read at each launch):
// FP8EXT_GEMM_PREFETCH_MB (MiB of weight, 0 = none) and FP8EXT_EARLY_LAUNCH=0.
inline WeightPrefetchPolicy weight_prefetch_policy() {
  constexpr int64_t kDefaultBudgetMiB = 4;  // about a microsecond of the H200's DRAM stream
  const char* mb = std::getenv("FP8EXT_GEMM_PREFETCH_MB");
  const char* early = std::getenv("FP8EXT_EARLY_LAUNCH");
  const int64_t budget_mib = mb && *mb ? std::atoll(mb) : kDefaultBudgetMiB;
  return {budget_mib > 0 ? budget_mib << 20 : 0, !(early && early[0] == '0' && early[1] == '\0')};
}

}  // namespace fp8ext::cuda::gemm
