#include "base/unique_fd.h"

#include <unistd.h>

namespace pswitch {

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) Reset(other.Release());
  return *this;
}

int UniqueFd::Release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void UniqueFd::Reset(int fd) {
  // close() is not retried on EINTR: on Linux the fd is released either way.
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

}  // namespace pswitch
