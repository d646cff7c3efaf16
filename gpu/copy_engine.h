// The copy engine: streams groups of host ranges into the arena, in order, and publishes group
// k's ready flag (with the job's epoch) as soon as group k's bytes are in place, so consumers
// compute on early groups while later ones are still in flight.
#ifndef PSWITCH_GPU_COPY_ENGINE_H_
#define PSWITCH_GPU_COPY_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "gpu/flags.h"

namespace pswitch::gpu {

struct CopySpan {
  // Pinned memory, or the arena itself (a move), live and unwritten until the job finishes.
  const std::byte* host = nullptr;
  uint64_t arena_offset = 0;
  uint64_t bytes = 0;
};

struct CopyGroup {
  std::vector<CopySpan> spans;
};

struct CopyJob {
  uint32_t epoch = 0;
  std::vector<CopyGroup> groups;
  // Group k publishes `epoch` to ready_flags[ready_flag_base + k].
  FlagArray* ready_flags = nullptr;
  uint32_t ready_flag_base = 0;
  // Optional: before writing any byte, wait until drain_flags[drain_index] reaches drain_value
  // (the previous tenant has nothing in flight). Fails with DeadlineExceeded after drain_timeout.
  FlagArray* drain_flags = nullptr;
  uint32_t drain_index = 0;
  uint32_t drain_value = 0;
  absl::Duration drain_timeout = absl::Seconds(10);
  // Optional: runs once on the copy thread right after the job finished (its ticket's Wait
  // returns at once by then), however it ended, so an owner learns of the end without a thread
  // of its own waiting. Must not block: post to a loop.
  std::function<void()> on_finished;
  // Optional: runs once on the copy thread when the job has failed (a timeout) while work it
  // queued may still run on the device: a copy stream waiting on a drain flag no one writes.
  // The job is not finished then: its pinned sources are still read and its flags may still be
  // written, so it finishes (on_finished) only once that work has run, or once the engine
  // declares the device lost. The owner must release what the work waits for (kill the tenant
  // that never drained). Must not block: post to a loop.
  std::function<void(const absl::Status&)> on_stalled;
};

// Per-group record for traces and benchmarks (CLOCK_MONOTONIC ns).
struct GroupTiming {
  int64_t copy_start_ns = 0;
  int64_t ready_ns = 0;  // flag published
  uint64_t bytes = 0;
};

// The handle of one submitted job. Thread-safe.
class CopyTicket {
 public:
  virtual ~CopyTicket() = default;
  // Stops the job at the next chunk or group boundary; groups already published stay published.
  virtual void Cancel() = 0;
  // Waits up to `timeout` for the job to finish: its per-group timings, Cancelled, or the
  // failure; DeadlineExceeded when it is still running then (it goes on).
  virtual absl::StatusOr<std::vector<GroupTiming>> Wait(absl::Duration timeout) = 0;
  // True once the job finished (Wait returns at once). Never before the device is done with
  // the job's sources and flags (or was declared lost).
  virtual bool finished() const = 0;
  // True once the job failed while work of it may still be on the device (on_stalled ran); it
  // stays unfinished until that work has run.
  virtual bool stalled() const = 0;
  // Groups whose flag is published so far.
  virtual size_t groups_done() const = 0;
};

// Thread-safe. Jobs run one at a time, in submission order.
class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // Validates `job` (flags present, spans inside the arena) and queues it.
  virtual absl::StatusOr<std::shared_ptr<CopyTicket>> Submit(CopyJob job) = 0;
};

// Checks a job against an arena of `arena_bytes` before it is queued.
absl::Status ValidateCopyJob(const CopyJob& job, uint64_t arena_bytes);

}  // namespace pswitch::gpu

#endif  // PSWITCH_GPU_COPY_ENGINE_H_
