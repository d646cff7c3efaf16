// The activity page's layout (gpu/activity_page.h) and the writer's open, POSIX only:
// libpswitch_monitor.so, preloaded into other processes, includes it and links nothing of pswitch.
#ifndef PSWITCH_GPU_ACTIVITY_PAGE_LAYOUT_H_
#define PSWITCH_GPU_ACTIVITY_PAGE_LAYOUT_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>

namespace pswitch::gpu {

inline constexpr uint64_t kActivityMagic = 0x31305443'41575350ull;  // "PSWACT01", little endian
struct ActivityPageLayout {
  uint64_t magic;
  std::atomic<uint64_t> launches;  // ever, by every writer
  std::atomic<uint64_t> busy;      // holds (host) or synchronisations (CUDA) under way
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
inline constexpr size_t kActivityFileBytes = 4096;

// The writer's side of opening a page, shared by ActivityWriter and libpswitch_monitor.so (which
// links nothing of pswitch): `path` opened (created, mode 0644, when absent) and mapped
// read-write into `*page`. Refused: a file that is not this user's or that others may write
// (they could truncate it under the mapping, and the writer would fault at its next store), one
// that is not a regular file (O_NONBLOCK: a FIFO there hangs nothing), and one with other
// contents (a short file, or a page-sized one without the magic that is not all zeros: it is
// left as it is). A new (empty) file becomes a page.
enum class MapActivity { kMapped, kSystemError /* errno says why */, kRefused };
inline MapActivity MapActivityPageForWriting(const char* path, ActivityPageLayout** page) {
  const int fd = ::open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) return MapActivity::kSystemError;
  const off_t page_bytes = static_cast<off_t>(kActivityFileBytes);
  struct stat st;
  MapActivity verdict = MapActivity::kMapped;
  if (::fstat(fd, &st) != 0) {
    verdict = MapActivity::kSystemError;
  } else if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
             (st.st_mode & (S_IWGRP | S_IWOTH)) != 0 ||
             (st.st_size > 0 && st.st_size < page_bytes)) {
    verdict = MapActivity::kRefused;
  } else if (st.st_size == 0 && ::ftruncate(fd, page_bytes) != 0) {
    verdict = MapActivity::kSystemError;
  }
  void* at = MAP_FAILED;
  if (verdict == MapActivity::kMapped) {
    at = ::mmap(nullptr, kActivityFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (at == MAP_FAILED) verdict = MapActivity::kSystemError;
  }
  const int saved = errno;
  ::close(fd);  // the mapping stays
  errno = saved;
  if (verdict != MapActivity::kMapped) return verdict;
  auto* p = static_cast<ActivityPageLayout*>(at);
  if (p->magic != kActivityMagic) {
    if (p->magic != 0 || p->launches.load() != 0 || p->busy.load() != 0) {
      ::munmap(at, kActivityFileBytes);
      return MapActivity::kRefused;
    }
    p->magic = kActivityMagic;  // counters are only ever added to
  }
  *page = p;
  return MapActivity::kMapped;
}

}  // namespace pswitch::gpu

#endif  // PSWITCH_GPU_ACTIVITY_PAGE_LAYOUT_H_
