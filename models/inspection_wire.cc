#include "models/inspection_wire.h"

#include <sys/socket.h>

#include <cerrno>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fd_message.h"
#include "base/json.h"
#include "base/status.h"
#include "nlohmann/json.hpp"

namespace pswitch::models {
namespace {

// Names, a precision and a batch: far below this.
constexpr size_t kMaxRequestBytes = 16 << 10;

// A report: its step (one byte), then done and total (little-endian uint32 each).
constexpr size_t kProgressBytes = 9;
// A profile's runs: far below this.
constexpr uint32_t kMaxCount = 1u << 20;

void PutU32(char* at, uint32_t v) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t GetU32(const char* at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(at[i])) << (8 * i);
  return v;
}

}  // namespace

void SendInspectionProgress(int socket_fd, const InspectionProgress& progress) {
  char bytes[kProgressBytes];
  bytes[0] = static_cast<char>(progress.step);
  PutU32(bytes + 1, progress.done);
  PutU32(bytes + 5, progress.total);
  // Progress only: a full buffer or a gone parent costs the inspection nothing.
  (void)base::SendMessageWithFds(socket_fd, absl::string_view(bytes, sizeof(bytes)), {},
                                 /*wait=*/false);
}

size_t DrainInspectionProgress(int socket_fd,
                               const std::function<void(const InspectionProgress&)>& told,
                               size_t max_reports) {
  size_t read = 0;
  while (read < max_reports) {
    char bytes[kProgressBytes + 1];
    // No control buffer: descriptors a child sends are closed by the kernel, never received.
    // MSG_TRUNC: the length returned is the message's, so a longer one is seen as such.
    const ssize_t n = ::recv(socket_fd, bytes, sizeof(bytes), MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // none waiting, or the child closed its end
    ++read;
    if (static_cast<size_t>(n) != kProgressBytes) continue;
    const auto step = static_cast<uint8_t>(bytes[0]);
    if (step < static_cast<uint8_t>(InspectionStep::kBuild) ||
        step > static_cast<uint8_t>(InspectionStep::kProfile)) {
      continue;
    }
    InspectionProgress progress{static_cast<InspectionStep>(step), GetU32(bytes + 1),
                                GetU32(bytes + 5)};
    const bool counted = progress.step == InspectionStep::kProfile;
    if (counted
            ? progress.total == 0 || progress.total > kMaxCount || progress.done > progress.total
            : progress.done != 0 || progress.total != 0) {
      continue;
    }
    if (told) told(progress);
  }
  return read;
}

absl::Status SendInspectionRequest(int socket_fd, const InspectionRequest& request) {
  const nlohmann::json j = {{"name", request.name},
                            {"zoo", request.zoo},
                            {"archive", request.archive_fd >= 0},
                            {"weights", request.weights_fd >= 0},
                            {"weights_name", request.weights_name},
                            {"dtype", request.dtype},
                            {"profile_batch", request.profile_batch}};
  const std::string text = j.dump();
  if (text.size() > kMaxRequestBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("an inspection request of ", text.size(), " bytes (names too long)"));
  }
  std::vector<int> fds;
  if (request.archive_fd >= 0) fds.push_back(request.archive_fd);
  if (request.weights_fd >= 0) fds.push_back(request.weights_fd);
  return base::SendMessageWithFds(socket_fd, text, fds);
}

absl::StatusOr<ReceivedInspection> ReceiveInspectionRequest(int socket_fd) {
  PSWITCH_ASSIGN_OR_RETURN(base::MessageWithFds message,
                           base::ReceiveMessageWithFds(socket_fd, kMaxRequestBytes, 2));
  PSWITCH_ASSIGN_OR_RETURN(
      nlohmann::json j, base::ParseUntrustedJson(message.bytes, "an inspection request",
                                                 {.max_bytes = kMaxRequestBytes, .max_depth = 2}));
  ReceivedInspection received;
  InspectionRequest& r = received.request;
  bool archive = false, weights = false;
  try {
    j.at("name").get_to(r.name);
    j.at("zoo").get_to(r.zoo);
    j.at("archive").get_to(archive);
    j.at("weights").get_to(weights);
    j.at("weights_name").get_to(r.weights_name);
    j.at("dtype").get_to(r.dtype);
    j.at("profile_batch").get_to(r.profile_batch);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("an inspection request: ", e.what()));
  }
  const size_t expected = (archive ? 1 : 0) + (weights ? 1 : 0);
  if (message.fds.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an inspection request with ", message.fds.size(), " descriptors, not ", expected));
  }
  size_t next = 0;
  if (archive) received.archive = std::move(message.fds[next++]);
  if (weights) received.weights = std::move(message.fds[next++]);
  r.archive_fd = received.archive.get();
  r.weights_fd = received.weights.get();
  if (r.zoo.empty() == !archive) {
    return absl::InvalidArgumentError("an inspection request names a zoo model or an archive");
  }
  return received;
}

}  // namespace pswitch::models
