#include "pipeline/link_reader.h"

#include <sys/socket.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace pswitch::pipeline {

LinkReader::LinkReader(int fd, std::string name, uint64_t max_payload_bytes, size_t max_queued)
    : fd_(fd),
      name_(std::move(name)),
      max_payload_bytes_(max_payload_bytes),
      max_queued_(max_queued),
      thread_([this] { ReadLoop(); }) {}

LinkReader::~LinkReader() {
  // Wakes the blocked receive with end-of-file.
  ::shutdown(fd_, SHUT_RD);
  thread_.join();
}

void LinkReader::ReadLoop() {
  while (true) {
    absl::StatusOr<Message> message =
        ReceiveMessage(fd_, max_payload_bytes_, absl::InfiniteFuture());
    absl::MutexLock lock(&mu_);
    if (!message.ok()) {
      error_ = message.status();
      return;
    }
    if (queue_.size() >= max_queued_) {
      error_ = absl::ResourceExhaustedError(
          absl::StrCat("peer sent more than ", max_queued_, " messages ahead of the schedule"));
      return;
    }
    queue_.push_back(*std::move(message));
  }
}

bool LinkReader::HasMessage() const {
  absl::MutexLock lock(&mu_);
  return !queue_.empty();
}

absl::StatusOr<Message> LinkReader::Take(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || !error_.ok(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat(name_, ": no message within ", absl::FormatDuration(timeout)));
  }
  if (queue_.empty()) {
    return absl::Status(error_.code(), absl::StrCat(name_, ": ", error_.message()));
  }
  Message message = std::move(queue_.front());
  queue_.pop_front();
  return message;
}

}  // namespace pswitch::pipeline
