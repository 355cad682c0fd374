#include "amax_slots.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <utility>


namespace fp8ext::torch_ops {

struct StreamAmaxSlots {
  std::mutex mutex;
  at::Tensor slots;  // two floats on the stream's device, never freed
  int next = 0;      // the slot that is zero now
  bool needs_zeroing = true;
};

namespace {

bool zero_free_enabled() {
  const char* v = std::getenv("FP8EXT_QUANT_ZERO_FREE");
  return !(v && std::strcmp(v, "0") == 0);
}

// Capturing, or the status unknown (the legacy stream while another stream
// captures, or an earlier error, left for the launches to report): no slots,
// and the call goes the way it always went.
bool maybe_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone;
}

// Streams that get slots, per process; later ones take the zeroing kernel. A
// bound because pairs are never freed (nothing tells when a stream's last call
// has finished) and a process may make a stream per request or thread.
constexpr size_t kMaxPairs = 1024;

// The pair of (device, stream), made on first use; nullptr if the stream has
// no id or the pairs are all handed out. Keyed by cudaStreamGetId, which a
// process never hands out twice: a destroyed stream's handle can come back for
// a new stream while the old stream's last call still runs. The map and its
// mutex are never freed, so nothing is released (or locked after its end)
// while the process exits.
StreamAmaxSlots* pair_of(int device, cudaStream_t stream) {
  unsigned long long id = 0;
  if (cudaStreamGetId(stream, &id) != cudaSuccess) return nullptr;
  static auto* map_mutex = new std::mutex();
  static auto* pairs = new std::map<std::pair<int, unsigned long long>, std::unique_ptr<StreamAmaxSlots>>();
  std::lock_guard<std::mutex> lock(*map_mutex);
  const auto key = std::make_pair(device, id);
  auto it = pairs->find(key);
  if (it == pairs->end()) {
    if (pairs->size() >= kMaxPairs) return nullptr;
    it = pairs->emplace(key, std::make_unique<StreamAmaxSlots>()).first;
  }
  return it->second.get();
}

}  // namespace

AmaxSlotsLease::AmaxSlotsLease(cudaStream_t stream, bool wanted) {
  if (!wanted || !zero_free_enabled() || maybe_capturing(stream)) return;
  const int device = c10::cuda::current_device();
  StreamAmaxSlots* pair = pair_of(device, stream);
  if (!pair) return;
  lock_ = std::unique_lock<std::mutex>(pair->mutex);
  if (!pair->slots.defined())
    pair->slots = at::empty({2}, at::TensorOptions().device(at::kCUDA, device).dtype(at::kFloat));
  if (pair->needs_zeroing) {  // first use, or after a call that did not finish
    if (cudaMemsetAsync(pair->slots.data_ptr(), 0, 2 * sizeof(float), stream) != cudaSuccess) {
      (void)cudaGetLastError();  // handled: this call takes the zeroing kernel, the next one tries again
      lock_ = {};
      return;
    }
    pair->needs_zeroing = false;
    pair->next = 0;
  }
  float* base = pair->slots.data_ptr<float>();
  slots_.amax = base + pair->next;
  slots_.zero_next = base + (1 - pair->next);
  pair_ = pair;
}

AmaxSlotsLease::~AmaxSlotsLease() {
  if (pair_ && !finished_) pair_->needs_zeroing = true;
}

void AmaxSlotsLease::finish(bool launched_ok) {
  finished_ = true;
  if (!pair_) return;
  if (!launched_ok) {
    pair_->needs_zeroing = true;  // the amax pass may have run without the quantize pass
  } else if (slots_.used) {
    pair_->next = 1 - pair_->next;
  }
}

}  // namespace fp8ext::torch_ops
