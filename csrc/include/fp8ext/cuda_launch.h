// What the CUDA launchers share: facts about the current device (cached per
// thread) and programmatic dependent launch (PDL, sm_90+).
//
// PDL lets a kernel be launched while the kernel before it in the stream is
// still finishing: its blocks become resident and set up, then wait in
// `wait_for_prior_kernels()` until the previous kernel has completed and its
// writes are visible. In a decode step (quantize, GEMM, quantize, GEMM, ...
// of a few microseconds each) that hides most of each launch gap. Every
// kernel launched with PDL must call `wait_for_prior_kernels()` before it
// reads or writes global memory, L2 prefetches (`prefetch_l2`) excepted, and
// every thread must reach that wait before it exits (our kernels start with
// `begin_dependent_kernel()`, or prefetch first; the amax workspace's zeroing
// kernel lets the next kernel launch before it waits; CUTLASS's sm90 GEMMs
// wait when built with CUTLASS_ENABLE_GDC_FOR_SM90). FP8EXT_PDL=0 in the
// environment turns it off (read at each launch, so a test can compare both
// ways in one process).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace fp8ext::cuda {

// Whether this build carries sm_90 code (FP8EXT_CUDA_ARCHS with 90a or 90).
#ifdef FP8EXT_WITH_SM90
inline constexpr bool kBuiltForSm90 = true;
#else
inline constexpr bool kBuiltForSm90 = false;
#endif

struct DeviceInfo {
  int device = 0;
  int sm_count = 132;
  int major = 0;  // compute capability
  // The kernels run code built for sm_90 only on Hopper, and only when the
  // build has it: otherwise the quantization and decode kernels JIT their
  // compute_80 PTX, which has neither the PDL wait nor clusters (a PDL launch
  // would read before the kernel before has finished; a cluster kernel traps).
  // PDL and the cluster kernels are for this case only.
  bool hopper() const { return major == 9 && kBuiltForSm90; }
};

inline const DeviceInfo& current_device_info() {
  thread_local int cached_device = -1;
  thread_local DeviceInfo info;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();  // keep a failed query from being reported by the next launch
    return info;
  }
  if (device != cached_device) {
    int sms = 0, major = 0;
    const bool ok = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
                    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess;
    if (!ok) (void)cudaGetLastError();
    info = DeviceInfo{device, ok && sms > 0 ? sms : 132, ok ? major : 0};
    cached_device = device;
  }
  return info;
}

inline bool pdl_enabled() {
  if (!current_device_info().hopper()) return false;
  const char* v = std::getenv("FP8EXT_PDL");
  return !(v && std::strcmp(v, "0") == 0);
}

// Fills `attr` with the PDL attribute and returns 1 when PDL is on, else 0:
// the count of attributes to pass.
inline unsigned pdl_attribute(cudaLaunchAttribute& attr) {
  if (!pdl_enabled()) return 0;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  return 1;
}

// kernel<<<grid, block, smem_bytes, stream>>>(args...), with PDL when it is on.
template <typename... Params, typename... Args>
cudaError_t launch_with_smem(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                             Args&&... args) {
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = pdl_attribute(attr[0]);
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// kernel<<<grid, block, 0, stream>>>(args...), with PDL when it is on.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args&&... args) {
  return launch_with_smem(kernel, grid, block, 0, stream, std::forward<Args>(args)...);
}

// Runs `set` (a cudaFuncSetAttribute call or two) once per Kernel, device and
// host thread, and again only if it failed: function attributes last for the
// context, and setting them before every launch costs a driver call each time
// (CUTLASS's adapter does that in initialize()). Kernel is a type naming the kernel.
template <class Kernel, class Set>
cudaError_t set_attributes_once(Set&& set) {
  constexpr int kMaxDevices = 64;
  thread_local bool done[kMaxDevices] = {};
  const int device = current_device_info().device;
  if (device < kMaxDevices && done[device]) return cudaSuccess;
  const cudaError_t err = set();
  if (err != cudaSuccess) (void)cudaGetLastError();  // returned, not left for the next launch check
  else if (device < kMaxDevices) done[device] = true;
  return err;
}

#ifdef __CUDACC__
// Returns once the kernels before this one in the stream have completed and
// their memory is visible (a no-op when launched without PDL).
__device__ __forceinline__ void wait_for_prior_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel in the stream be launched now (it still waits for this
// one to finish before touching memory): called early, its setup overlaps ours.
__device__ __forceinline__ void allow_next_kernel_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks L2 for the 128-byte line holding p and does not wait for it. The one
// memory access allowed before `wait_for_prior_kernels()`: L2 is where every
// SM's writes land, so a prefetched line cannot be stale. A kernel launched
// early by PDL uses it for what the kernel before cannot have changed (a
// weight, the unchanged input of a second pass), so the fetch overlaps that
// kernel's end.
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// prefetch_l2 for `bytes` contiguous bytes in one instruction (the TMA unit's
// bulk prefetch, sm_90; nothing on older GPUs). p 16-byte aligned, bytes a
// multiple of 16.
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// The first statement of every kernel launched through `launch`: wait for the
// kernels before, then let the next one start its setup.
__device__ __forceinline__ void begin_dependent_kernel() {
  wait_for_prior_kernels();
  allow_next_kernel_launch();
}
#endif

}  // namespace fp8ext::cuda
