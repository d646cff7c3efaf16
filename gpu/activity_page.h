// A device's activity as its main job makes it, in a small shared file (issue 30 item 3): how many
// kernels the job launched (CUDA: libpswitch_monitor.so, preloaded into the job) or how many times
// it took the host device's compute lock (the host backend's simulated GPU), and how many holds
// are under way. The job writes it; pswitchd reads it every window (--detect-bubbles) and finds
// the job's bubbles from it, the job calling nothing of pswitch (fill::BubbleDetector).
// Writers only add to the counters and readers take differences, so either side may start, stop
// or restart at any time. The reader never maps the file (a writer could truncate it under the
// mapping): it reads the counters with pread, and a page that is not one is an error.
#ifndef PSWITCH_GPU_ACTIVITY_PAGE_H_
#define PSWITCH_GPU_ACTIVITY_PAGE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "gpu/activity_page_layout.h"

namespace pswitch::gpu {

struct ActivityCounts {
  uint64_t launches = 0;
  uint64_t busy = 0;
};

// The job's side: the page mapped read-write (the file created, mode 0644, when absent; one of
// another user's, or that others may write, is refused).
// Thread-safe; no lock, allocation or system call after Open.
class ActivityWriter {
 public:
  static absl::StatusOr<std::unique_ptr<ActivityWriter>> Open(const std::string& path);
  ~ActivityWriter();
  ActivityWriter(const ActivityWriter&) = delete;
  ActivityWriter& operator=(const ActivityWriter&) = delete;

  void Launched() { page_->launches.fetch_add(1, std::memory_order_relaxed); }
  // A hold of the device begins (it counts as a launch) or ends.
  void BeginBusy() {
    page_->launches.fetch_add(1, std::memory_order_relaxed);
    page_->busy.fetch_add(1, std::memory_order_relaxed);
  }
  void EndBusy() { page_->busy.fetch_sub(1, std::memory_order_relaxed); }

 private:
  explicit ActivityWriter(ActivityPageLayout* page) : page_(page) {}
  ActivityPageLayout* const page_;
};

// pswitchd's side.
class ActivityReader {
 public:
  // NotFound while no job has created the file.
  static absl::StatusOr<ActivityReader> Open(const std::string& path);
  // DataLoss when the file is too short or not an activity page.
  absl::StatusOr<ActivityCounts> Read() const;
  // Whether `path` still names the file this reads (not deleted, nor replaced by another).
  bool StillAt(const std::string& path) const;

 private:
  explicit ActivityReader(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

// The host device `index`'s page, beside its compute lock (gpu/host/compute_lock.h).
std::string HostActivityPath(int index);

}  // namespace pswitch::gpu

#endif  // PSWITCH_GPU_ACTIVITY_PAGE_H_
