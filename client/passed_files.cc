#include "client/passed_files.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "proto/frame_channel.h"

namespace pswitch::client {

absl::Status PassedFiles::Read(const std::string& path, proto::FileRole role) {
  if (path.empty()) return absl::OkStatus();
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (!fd.valid()) return ErrnoStatus(absl::StrCat("open '", path, "'"));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(absl::StrCat("stat '", path, "'"));
  // pswitchd refuses anything else too; saying so here names the path it cannot see.
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  Add(std::move(fd), role);
  return absl::OkStatus();
}

absl::Status PassedFiles::Create(const std::string& path, proto::FileRole role) {
  if (path.empty()) return absl::OkStatus();
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0644));
  if (!fd.valid()) return ErrnoStatus(absl::StrCat("create '", path, "'"));
  created_.push_back(path);
  Add(std::move(fd), role);
  return absl::OkStatus();
}

void PassedFiles::UnlinkCreated() {
  for (const std::string& path : created_) ::unlink(path.c_str());
  created_.clear();
}

flatbuffers::Offset<flatbuffers::Vector<proto::FileRole>> PassedFiles::Roles(
    flatbuffers::FlatBufferBuilder& b) const {
  return roles_.empty() ? 0 : b.CreateVector(roles_);
}

void PassedFiles::Add(UniqueFd fd, proto::FileRole role) {
  fds_.push_back(fd.get());
  owned_.push_back(std::move(fd));
  roles_.push_back(role);
}

absl::Status SendFrameWithFds(int socket_fd, std::span<const uint8_t> frame,
                              const std::vector<int>& fds) {
  if (fds.size() <= 1) return proto::SendAllWithFd(socket_fd, frame, fds.empty() ? -1 : fds[0]);
  constexpr size_t kMaxFds = 8;
  if (fds.size() > kMaxFds) return absl::InvalidArgumentError("too many files for one request");
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  iovec iov{const_cast<uint8_t*>(frame.data()), 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  // The first byte carries the fds; the rest of the frame follows as plain bytes.
  while (true) {
    ssize_t n = ::sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
    if (n == 1) break;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return ErrnoStatus("sendmsg");
  }
  return proto::SendAllWithFd(socket_fd, frame.subspan(1), -1);
}

}  // namespace pswitch::client
