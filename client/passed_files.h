// Files a request names, opened by the client itself and passed to pswitchd as open files over
// its Unix socket (ClientRequest.passed_files, docs/dataplane.md), so pswitchd never opens a
// path a client names with its own privileges; and the send that carries several fds with one
// frame.
#ifndef PSWITCH_CLIENT_PASSED_FILES_H_
#define PSWITCH_CLIENT_PASSED_FILES_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "base/unique_fd.h"
#include "flatbuffers/flatbuffers.h"
#include "proto/client_generated.h"

namespace pswitch::client {

// The files of one request, in the order added, each with its role. Owns the fds (closed when
// destroyed: the kernel keeps its own reference for pswitchd once sent). Not thread-safe.
class PassedFiles {
 public:
  // Opens `path` (relative to this process's working directory) to be read, for `role`; nothing
  // when `path` is empty. The open's error naming the path, InvalidArgument for anything but a
  // regular file.
  absl::Status Read(const std::string& path, proto::FileRole role);
  // Creates `path` (a new file, never an existing one: AlreadyExists) to be written, for `role`.
  absl::Status Create(const std::string& path, proto::FileRole role);
  // Removes the files Create made (the request failed: nothing will be written to them).
  void UnlinkCreated();

  const std::vector<int>& fds() const { return fds_; }
  // The request's passed_files (null offset when there are none).
  flatbuffers::Offset<flatbuffers::Vector<proto::FileRole>> Roles(
      flatbuffers::FlatBufferBuilder& b) const;

 private:
  void Add(UniqueFd fd, proto::FileRole role);

  std::vector<UniqueFd> owned_;
  std::vector<int> fds_;
  std::vector<proto::FileRole> roles_;
  std::vector<std::string> created_;
};

// Sends `frame` on stream socket `socket_fd` with every fd of `fds` (at most 8) attached to its
// first byte in one SCM_RIGHTS message, as proto::SendAllWithFd does for one fd: pswitchd takes
// them as that frame's files. The caller keeps its fds.
absl::Status SendFrameWithFds(int socket_fd, std::span<const uint8_t> frame,
                              const std::vector<int>& fds);

}  // namespace pswitch::client

#endif  // PSWITCH_CLIENT_PASSED_FILES_H_
