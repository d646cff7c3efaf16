// pswitchd's side of a resident fill run's bell (fill/bell_layout.h): the page, its region (lent
// to the run's worker), opening and closing bubbles, stopping the run, and reading back what the
// worker says it did. Thread-safe: every field is an atomic; one writer (the fill manager, under
// its lock) opens and closes, any thread may stop. What pswitchd decides on (stopped, opens) is
// kept here as well as written to the page: the worker maps the page writable.
#ifndef PSWITCH_CONTROLLER_BUBBLE_BELL_H_
#define PSWITCH_CONTROLLER_BUBBLE_BELL_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dataplane/transfer_region.h"
#include "fill/bell_layout.h"
#include "proto/host_tensor.h"

namespace pswitch::controller {

class BubbleBell {
 public:
  // A new page (a sealed memfd of pswitchd's), closed, mapped read-write here.
  static absl::StatusOr<std::shared_ptr<BubbleBell>> Create();
  ~BubbleBell();
  BubbleBell(const BubbleBell&) = delete;
  BubbleBell& operator=(const BubbleBell&) = delete;

  const std::shared_ptr<const dataplane::TransferRegion>& region() const { return region_; }
  // The page as a Run names it.
  proto::ByteSlice slice() const { return {region_->id(), 0, fill::kBellBytes}; }

  // A bubble ending at `end_ns` (CLOCK_MONOTONIC) is open; a step still running at `cut_at_ns`
  // is cut. Wakes the worker.
  void Open(int64_t end_ns, int64_t cut_at_ns);
  // The bubble ended at `now_ns` (sooner than announced, perhaps): a step under way is cut now.
  void Close(int64_t now_ns);
  // The run is to end: wakes it wherever it waits. Idempotent.
  void Stop();
  // pswitchd's own record, never read back from the page (the worker may write all of it).
  bool stopped() const { return stopped_.load(); }
  uint64_t opens() const { return opens_.load(); }  // bubbles opened so far

  // What the worker wrote: its own word, so no bound is trusted (callers clamp).
  struct Report {
    bool stepping = false;
    int64_t last_step_start_ns = 0;
    int64_t idle_since_ns = 0;
    uint64_t steps = 0;
    int64_t step_ns = 0;
    uint64_t iterations_done = 0;
    uint64_t overruns = 0;
    int64_t overrun_ns = 0;
    uint64_t late_starts = 0;
    uint64_t parts = 0;
  };
  Report Read() const;

  // Tests: the page as the worker sees it.
  fill::BellLayout* page_for_test() const { return page_; }

 private:
  BubbleBell(std::shared_ptr<const dataplane::TransferRegion> region, fill::BellLayout* page)
      : region_(std::move(region)), page_(page) {}

  const std::shared_ptr<const dataplane::TransferRegion> region_;
  fill::BellLayout* const page_;
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> opens_{0};
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_BUBBLE_BELL_H_
