#include "gpu/host/compute_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status.h"

namespace pswitch::gpu {

absl::StatusOr<ComputeLock> ComputeLock::Open(const std::string& path, bool record_activity) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return ErrnoStatus(absl::StrCat("open compute lock ", path));
  UniqueFd lock(fd);
  std::shared_ptr<ActivityWriter> activity;
  if (record_activity) {
    // Without its page the job still runs, unseen by bubble detection (as without a monitor).
    absl::StatusOr<std::unique_ptr<ActivityWriter>> page =
        ActivityWriter::Open(absl::StrCat(path, ".activity"));
    if (page.ok()) {
      activity = std::move(*page);
    } else {
      base::Log(base::LogLevel::kWarn, "activity_page_unavailable").Field("detail", page.status());
    }
  }
  return ComputeLock(std::move(lock), std::move(activity));
}

std::string ComputeLock::DefaultPath(int index) {
  // A private set of simulated GPUs (tests running side by side), else the machine's.
  const char* dir = std::getenv("PSWITCH_HOST_DEVICE_DIR");
  return absl::StrCat(dir != nullptr && *dir != '\0' ? dir : "/tmp", "/pswitch-host-gpu-", index,
                      ".lock");
}

ComputeLock::Hold::Hold(int fd, ActivityWriter* activity) : fd_(fd), activity_(activity) {
  // Busy from the moment it wants the device: a job waiting behind a fill step is no bubble.
  if (activity_ != nullptr) activity_->BeginBusy();
  // EINTR only: a valid, open fd cannot otherwise fail to lock.
  while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
  }
}

ComputeLock::Hold::~Hold() {
  if (activity_ != nullptr) activity_->EndBusy();
  if (fd_ >= 0) ::flock(fd_, LOCK_UN);
}

}  // namespace pswitch::gpu
