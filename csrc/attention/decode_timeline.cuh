// Per-block timestamps of the decode and merge kernels (paged_decode.cu), for
// scripts/device/decode_timeline.cu: where a decode call's fixed cost goes
// (bench/NOTES.md, issue 6). Compiled in only with -DFP8EXT_DECODE_TIMELINE,
// which only that script passes: the library's kernels carry none of it.
//
// Each block's thread 0 writes %globaltimer readings (ns) into a ring of
// kRing launches. The slot is the count of merges completed so far: the
// merge's last block bumps it, and PDL orders that before the next decode's
// wait returns.
#pragma once

#include <cstdint>

#ifdef FP8EXT_DECODE_TIMELINE
namespace fp8ext::cuda::decode_timeline {

constexpr int kRing = 4;
constexpr int kMaxBlocks = 4096;
enum DecodeStamp { kEntry, kReleased, kFirstData, kLoopDone, kWarpsMerged, kExit, kDecodeSm, kDecodeStamps };
enum MergeStamp { kMergeEntry, kMergeReleased, kMergeExit, kMergeSm, kMergeStamps };

__device__ uint64_t decode_stamps[kRing][kMaxBlocks][kDecodeStamps];
__device__ uint64_t merge_stamps[kRing][kMaxBlocks][kMergeStamps];
__device__ unsigned merges_done;        // the ring slot of the decode running now
__device__ unsigned merge_blocks_done;  // blocks of the running merge that have finished

__device__ __forceinline__ uint64_t now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint64_t sm_id() {
  uint32_t s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

__device__ __forceinline__ int block_index() {
  return static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
}

// Thread 0 of a decode block, last thing before it exits.
__device__ __forceinline__ void record_decode(uint64_t entry, uint64_t released, uint64_t first, uint64_t loop,
                                              uint64_t merged) {
  const uint64_t exit = now();
  const int b = block_index();
  if (b >= kMaxBlocks) return;
  uint64_t* s = decode_stamps[*const_cast<volatile unsigned*>(&merges_done) % kRing][b];
  s[kEntry] = entry, s[kReleased] = released, s[kFirstData] = first, s[kLoopDone] = loop, s[kWarpsMerged] = merged,
  s[kExit] = exit;
  s[kDecodeSm] = sm_id();
}

// Thread 0 of a merge block, last thing before it exits; the merge's last
// block to get here moves the ring on.
__device__ __forceinline__ void record_merge(uint64_t entry, uint64_t released) {
  const uint64_t exit = now();
  const int b = block_index();
  const unsigned slot = *const_cast<volatile unsigned*>(&merges_done);
  if (b < kMaxBlocks) {
    uint64_t* s = merge_stamps[slot % kRing][b];
    s[kMergeEntry] = entry, s[kMergeReleased] = released, s[kMergeExit] = exit, s[kMergeSm] = sm_id();
  }
  __threadfence();
  if (atomicAdd(&merge_blocks_done, 1u) == gridDim.x * gridDim.y * gridDim.z - 1) {
    merge_blocks_done = 0;
    __threadfence();
    atomicAdd(&merges_done, 1u);
  }
}

}  // namespace fp8ext::cuda::decode_timeline
#define FP8EXT_TIMELINE(...) __VA_ARGS__
#else
#define FP8EXT_TIMELINE(...)
#endif
