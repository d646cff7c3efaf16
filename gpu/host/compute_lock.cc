#include "gpu/host/compute_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::gpu {

absl::StatusOr<ComputeLock> ComputeLock::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return ErrnoStatus(absl::StrCat("open compute lock ", path));
  return ComputeLock(UniqueFd(fd));
}

std::string ComputeLock::DefaultPath(int index) {
  return absl::StrCat("/tmp/pswitch-host-gpu-", index, ".lock");
}

ComputeLock::Hold::Hold(int fd) : fd_(fd) {
  // EINTR only: a valid, open fd cannot otherwise fail to lock.
  while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
  }
}

ComputeLock::Hold::~Hold() {
  if (fd_ >= 0) ::flock(fd_, LOCK_UN);
}

}  // namespace pswitch::gpu
