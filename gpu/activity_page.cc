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
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0660));
  if (fd.get() < 0) return ErrnoStatus(absl::StrCat("open activity page ", path));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(absl::StrCat("stat activity page ", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("activity page ", path, " is not a file"));
  }
  // A new (empty) file becomes a page; a short one is something else.
  if (st.st_size > 0 && st.st_size < static_cast<off_t>(kActivityFileBytes)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not an activity page"));
  }
  if (st.st_size == 0 && ::ftruncate(fd.get(), kActivityFileBytes) != 0) {
    return ErrnoStatus(absl::StrCat("size activity page ", path));
  }
  void* at = ::mmap(nullptr, kActivityFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (at == MAP_FAILED) return ErrnoStatus(absl::StrCat("map activity page ", path));
  auto* page = static_cast<ActivityPageLayout*>(at);
  // A new (zeroed) page gets its magic; counters are only ever added to. A page of something
  // else is left alone.
  if (page->magic != kActivityMagic) {
    if (page->magic != 0 || page->launches.load() != 0 || page->busy.load() != 0) {
      ::munmap(at, kActivityFileBytes);
      return absl::FailedPreconditionError(absl::StrCat(path, " is not an activity page"));
    }
    page->magic = kActivityMagic;
  }
  return std::unique_ptr<ActivityWriter>(new ActivityWriter(page));
}

ActivityWriter::~ActivityWriter() { ::munmap(page_, kActivityFileBytes); }

absl::StatusOr<ActivityReader> ActivityReader::Open(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
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

std::string HostActivityPath(int index) {
  return absl::StrCat(ComputeLock::DefaultPath(index), ".activity");
}

}  // namespace pswitch::gpu
