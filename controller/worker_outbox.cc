#include "controller/worker_outbox.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "proto/frame_channel.h"

namespace pswitch::controller {

WorkerOutbox::WorkerOutbox(int socket, OutboxLimits limits)
    : socket_(socket),
      limits_(limits),
      wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      writer_([this] { WriteLoop(); }) {}

WorkerOutbox::~WorkerOutbox() { Close(); }

absl::Status WorkerOutbox::Send(std::span<const uint8_t> payload, int fd_to_pass) {
  PSWITCH_ASSIGN_OR_RETURN(auto header, proto::EncodeFrameHeader(payload.size()));
  const size_t bytes = proto::kFrameHeaderBytes + payload.size();
  absl::MutexLock lock(&mu_);
  if (!failed_.ok()) return failed_;
  if (closing_) return absl::UnavailableError("the worker's command queue is closed");
  if (queue_.size() >= limits_.max_frames || queued_bytes_ + bytes > limits_.max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the worker has not taken its commands: ", queue_.size(), " frames (",
                     queued_bytes_, " bytes) wait, and ", bytes, " more would pass the limit of ",
                     limits_.max_frames, " frames or ", limits_.max_bytes, " bytes"));
  }
  size_t sent = 0;
  if (queue_.empty()) {
    // The writer is idle (it keeps the frame it sends at the queue's front), so this thread may
    // write: one non-blocking sendmsg, under the lock so no later frame can overtake it. A Run
    // (descriptors only) almost always fits the socket whole, and then reaches the worker
    // without a hand-over to the writer thread and its wake-up.
    const std::span<const uint8_t> parts[] = {header, payload};
    absl::StatusOr<size_t> n = proto::SendPartsOnce(socket_, parts, 0, fd_to_pass);
    if (!n.ok()) {
      failed_ =
          absl::UnavailableError(absl::StrCat("sending to the worker: ", n.status().message()));
      return failed_;
    }
    if (*n == bytes) return absl::OkStatus();
    sent = *n;
  }
  // The rest waits for the writer. A passed fd travelled with the first byte if any was sent.
  Frame frame{header, std::vector<uint8_t>(payload.begin(), payload.end()), UniqueFd(), sent};
  if (fd_to_pass >= 0 && sent == 0) {
    // The queued frame owns its own copy until the kernel has taken it: the caller's may close.
    frame.fd = UniqueFd(::fcntl(fd_to_pass, F_DUPFD_CLOEXEC, 0));
    if (!frame.fd.valid()) return ErrnoStatus("dup of a descriptor for a worker command");
  }
  if (queue_.empty()) progress_ = absl::Now();
  queue_.push_back(std::move(frame));
  queued_bytes_ += bytes;
  return absl::OkStatus();
}

absl::Time WorkerOutbox::UnsentSince() const {
  absl::MutexLock lock(&mu_);
  return queue_.empty() ? absl::InfiniteFuture() : progress_;
}

size_t WorkerOutbox::queued_bytes() const {
  absl::MutexLock lock(&mu_);
  return queued_bytes_;
}

void WorkerOutbox::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closing_ && !writer_.joinable()) return;
    closing_ = true;
  }
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  if (writer_.joinable() && writer_.get_id() != std::this_thread::get_id()) writer_.join();
  absl::MutexLock lock(&mu_);
  queue_.clear();
  queued_bytes_ = 0;
}

bool WorkerOutbox::WriteFrame(const Frame& frame) {
  const std::span<const uint8_t> parts[] = {frame.header, frame.payload};
  const size_t total = frame.header.size() + frame.payload.size();
  size_t sent = frame.sent;
  while (sent < total) {
    absl::StatusOr<size_t> n = proto::SendPartsOnce(socket_, parts, sent, frame.fd.get());
    if (!n.ok()) {
      absl::MutexLock lock(&mu_);
      failed_ =
          absl::UnavailableError(absl::StrCat("sending to the worker: ", n.status().message()));
      return false;
    }
    if (*n > 0) {
      sent += *n;
      absl::MutexLock lock(&mu_);
      progress_ = absl::Now();
      continue;
    }
    // Full: wait until the worker reads, or Close. Unbounded on purpose: how long a worker may
    // leave its socket full is the watchdog's call (UnsentSince), and Close ends the wait.
    pollfd fds[2] = {{socket_, POLLOUT, 0}, {wake_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) {
      absl::MutexLock lock(&mu_);
      failed_ = ErrnoStatus("poll on a worker's socket");
      return false;
    }
    if ((fds[1].revents & POLLIN) != 0) return false;
  }
  return true;
}

void WorkerOutbox::WriteLoop() {
  while (true) {
    const Frame* front = nullptr;
    {
      absl::MutexLock lock(&mu_);
      // Idle until there is something to send: the wait ends with the outbox (Close).
      mu_.Await(absl::Condition(this, &WorkerOutbox::HasWork));
      if (closing_) return;
      front = &queue_.front();
    }
    if (!WriteFrame(*front)) return;
    absl::MutexLock lock(&mu_);
    queued_bytes_ -= front->header.size() + front->payload.size();
    queue_.pop_front();  // closes the fd it passed: the worker has its own now
    if (!queue_.empty()) progress_ = absl::Now();
  }
}

}  // namespace pswitch::controller
