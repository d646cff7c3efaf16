// Blocks an allocator handed out for device work and got back from libtorch, kept until they
// may be reused in stream order (the CUDA lease allocator's bookkeeping,
// cuda/cuda_lease_allocator.h). libtorch frees a tensor when its last CPU reference goes, while
// kernels that use it may still be queued on its stream. A freed block waits in its stream's list.
// An allocation on that same stream may take the list back at once: what it enqueues runs after
// every use. An allocation on another stream first fences a list (one event recorded on its stream
// covers every block freed there so far, since their uses were all enqueued before their free) and
// takes the fenced blocks once the event has completed. Events come from EventOps, so the
// bookkeeping runs without a device in tests.
#ifndef PSWITCH_WORKER_STREAM_FREES_H_
#define PSWITCH_WORKER_STREAM_FREES_H_

#include <deque>
#include <functional>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace pswitch::worker {

// Thread-safe. Handles are opaque (cudaStream_t and cudaEvent_t on CUDA).
class StreamFrees {
 public:
  using Stream = void*;
  using Event = void*;
  struct EventOps {
    // An event recorded now on `stream`; nullptr when none could be (the blocks then stay for
    // their own stream's reuse).
    std::function<Event(Stream)> record;
    // True once `event` has completed.
    std::function<bool(Event)> completed;
    // `event` is no longer needed (the allocator keeps it for reuse).
    std::function<void(Event)> recycle;
  };

  explicit StreamFrees(EventOps ops) : ops_(std::move(ops)) {}
  StreamFrees(const StreamFrees&) = delete;
  StreamFrees& operator=(const StreamFrees&) = delete;

  // `block` was freed; its last uses were enqueued on `stream`.
  void Freed(void* block, Stream stream);
  // Removes and returns the blocks an allocation on `stream` may use now: every block freed on
  // `stream`, and other streams' fenced blocks whose event completed. With `fence`, first fences
  // the other streams' blocks not fenced yet.
  std::vector<void*> Reusable(Stream stream, bool fence);
  // True while fenced blocks wait for an event that has not completed.
  bool waiting() const;

 private:
  struct Frees {
    Stream stream = nullptr;
    std::vector<void*> unfenced;  // freed since the last fence
    // In the order their events were recorded on the stream, so they complete in order.
    std::deque<std::pair<Event, std::vector<void*>>> fenced;
  };

  const EventOps ops_;
  mutable absl::Mutex mu_;
  std::vector<Frees> streams_ ABSL_GUARDED_BY(mu_);  // one per stream that freed (a few)
};

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_STREAM_FREES_H_
