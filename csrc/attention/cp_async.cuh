// cp.async (sm_80+) wrappers: asynchronous 16-byte copies from global to
// shared memory, in commit groups a thread can wait on.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fp8ext::cuda::decode {

// cp.async (sm_80+): 16 bytes from global to shared memory through L2 only;
// with `valid` false the 16 bytes are zero-filled and nothing is read.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>  // waits until at most N of this thread's groups are still in flight
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

}  // namespace fp8ext::cuda::decode
