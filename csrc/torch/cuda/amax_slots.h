// Per-stream amax slots for eager per-tensor current scaling, so that its two
// passes run without the workspace-zeroing kernel (cuda::ZeroedAmaxSlots in
// fp8ext/quantize_cuda.h says what the kernels do with them).
//
// Each (device, stream) whose eager calls are large enough for the two passes
// gets two floats, zeroed on that stream when first used and never freed (the
// process's first 1024 such streams; later ones take the zeroing kernel).
// Calls on the stream take the slots in turn; the lease holds the pair's lock
// from before the launches until after, so host threads sharing a stream
// enqueue in the order they flip the parity. None is handed out while the
// stream is capturing a CUDA graph (the graph's replays would reuse one slot
// without zeroing it; those calls keep the zeroing kernel), or with
// FP8EXT_QUANT_ZERO_FREE=0 in the environment (read at each call, so one
// process can time both ways).
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>

#include "fp8ext/quantize_cuda.h"

namespace fp8ext::torch_ops {

struct StreamAmaxSlots;  // one stream's pair and its parity (amax_slots.cpp)

class AmaxSlotsLease {
 public:
  // The slots for an eager call on `stream` (of the current device), or a lease
  // without slots (also when not `wanted`).
  AmaxSlotsLease(cudaStream_t stream, bool wanted);
  AmaxSlotsLease(const AmaxSlotsLease&) = delete;
  AmaxSlotsLease& operator=(const AmaxSlotsLease&) = delete;
  // Without finish(true) (an error, an exception) the pair is zeroed again before its next use.
  ~AmaxSlotsLease();

  // What to pass to cuda::quantize_per_tensor; nullptr without slots.
  cuda::ZeroedAmaxSlots* slots() { return pair_ ? &slots_ : nullptr; }
  // After the call: `launched_ok` is its status == cudaSuccess.
  void finish(bool launched_ok);

 private:
  StreamAmaxSlots* pair_ = nullptr;
  std::unique_lock<std::mutex> lock_;
  cuda::ZeroedAmaxSlots slots_;
  bool finished_ = false;
};

}  // namespace fp8ext::torch_ops
