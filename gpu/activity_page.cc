#include "gpu/activity_page.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "gpu/host/compute_lock.h"

namespace pswitch::gpu {

absl::StatusOr<std::unique_ptr<ActivityWriter>> ActivityWriter::Open(const std::string& path) {
  ActivityPageLayout* page = nullptr;
  switch (MapActivityPageForWriting(path.c_str(), &page)) {
    case MapActivity::kMapped:
      return std::unique_ptr<ActivityWriter>(new ActivityWriter(page));
    case MapActivity::kSystemError:
      return ErrnoStatus(absl::StrCat("activity page ", path));
    case MapActivity::kRefused:
      break;
  }
  return absl::FailedPreconditionError(
      absl::StrCat(path, " is not an activity page of this user's that only it may write"));
}

ActivityWriter::~ActivityWriter() { ::munmap(page_, kActivityFileBytes); }

absl::StatusOr<ActivityReader> ActivityReader::Open(const std::string& path) {
  // O_NONBLOCK: a FIFO put there does not hang the monitor.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no activity page ", path));
    return ErrnoStatus(absl::StrCat("open activity page ", path));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("activity page ", path, " is not a file"));
  }
  return ActivityReader(std::move(fd));
}

absl::StatusOr<ActivityCounts> ActivityReader::Read() const {
  uint64_t words[3];
  ssize_t n;
  do {
    n = ::pread(fd_.get(), words, sizeof(words), 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoStatus("read activity page");
  if (n != static_cast<ssize_t>(sizeof(words)) || words[0] != kActivityMagic) {
    return absl::DataLossError("not an activity page (short, or no magic)");
  }
  return ActivityCounts{words[1], words[2]};
}

bool ActivityReader::StillAt(const std::string& path) const {
  struct stat named, open;
  return ::stat(path.c_str(), &named) == 0 && ::fstat(fd_.get(), &open) == 0 &&
         named.st_dev == open.st_dev && named.st_ino == open.st_ino;
}

std::string HostActivityPath(int index) {
  return absl::StrCat(ComputeLock::DefaultPath(index), ".activity");
}

}  // namespace pswitch::gpu
