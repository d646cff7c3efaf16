#include "proto/framed_connection.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "proto/frame_channel.h"

namespace pswitch::proto {
namespace {

// How long a closing connection may take to flush its last replies to a peer not reading.
constexpr absl::Duration kLinger = absl::Seconds(10);

}  // namespace

std::shared_ptr<FramedConnection> FramedConnection::Create(Socket socket, ConnectionLimits limits,
                                                           FrameHandler on_frame,
                                                           ErrorReplyBuilder error_reply,
                                                           CloseHandler on_close) {
  FrameWithFdsHandler with_fds = [on_frame = std::move(on_frame)](
                                     FramedConnection& c, std::vector<uint8_t> payload,
                                     std::vector<UniqueFd> /*fds: none asked for; closed*/) {
    on_frame(c, std::move(payload));
  };
  return Create(std::move(socket), std::move(limits), std::move(with_fds), std::move(error_reply),
                std::move(on_close));
}

std::shared_ptr<FramedConnection> FramedConnection::Create(Socket socket, ConnectionLimits limits,
                                                           FrameWithFdsHandler on_frame,
                                                           ErrorReplyBuilder error_reply,
                                                           CloseHandler on_close) {
  return std::shared_ptr<FramedConnection>(
      new FramedConnection(std::move(socket), std::move(limits), std::move(on_frame),
                           std::move(error_reply), std::move(on_close)));
}

FramedConnection::FramedConnection(Socket socket, ConnectionLimits limits,
                                   FrameWithFdsHandler on_frame, ErrorReplyBuilder error_reply,
                                   CloseHandler on_close)
    : socket_(std::move(socket)),
      limits_(std::move(limits)),
      on_frame_(std::move(on_frame)),
      error_reply_(std::move(error_reply)),
      on_close_(std::move(on_close)),
      decoder_(limits_.max_frame_bytes),
      read_buffer_(64 * 1024),
      timer_(socket_.get_executor()) {}

void FramedConnection::Start() {
  last_activity_ = absl::Now();
  ReadMore();
  ArmTimer();
}

void FramedConnection::ReadMore() {
  if (closed_ || close_after_writes_ || payload_done_) return;
  if (limits_.max_fds_per_frame > 0) {
    ReadWithFds();
    return;
  }
  // A frame may be followed by its raw payload: never read past the frame's end, so the payload
  // is still in the socket when the handler says where it goes.
  const size_t want = limits_.max_payload_bytes > 0
                          ? std::min(read_buffer_.size(), decoder_.BytesNeeded())
                          : read_buffer_.size();
  socket_.async_read_some(asio::buffer(read_buffer_.data(), want), [self = shared_from_this()](
                                                          const asio::error_code& ec, size_t n) {
    if (self->closed_) return;
    if (ec) {
      self->Close(ec == asio::error::eof ? absl::OkStatus()
                                         : absl::UnavailableError("read failed: " + ec.message()));
      return;
    }
    self->OnBytes(n);
  });
}

void FramedConnection::ReadWithFds() {
  // Asio has no ancillary-data read: wait for readability, then recvmsg directly.
  socket_.async_wait(Socket::wait_read, [self = shared_from_this()](const asio::error_code& ec) {
    if (self->closed_) return;
    if (ec) {
      self->Close(absl::UnavailableError("read failed: " + ec.message()));
      return;
    }
    // Never past this frame: fds that come with the next frame must not be taken for this one's.
    const size_t want = std::min(self->read_buffer_.size(), self->decoder_.BytesNeeded());
    iovec iov{self->read_buffer_.data(), want};
    const size_t max_fds = self->limits_.max_fds_per_frame;
    std::vector<char> control(CMSG_SPACE(max_fds * sizeof(int)));
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    const ssize_t n =
        ::recvmsg(self->socket_.native_handle(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        self->ReadWithFds();
        return;
      }
      self->Close(absl::UnavailableError(absl::StrCat("read failed: ", std::strerror(errno))));
      return;
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        // Owned from here: each is closed unless the handler keeps it.
        self->frame_fds_.emplace_back(fd);
      }
    }
    if ((msg.msg_flags & MSG_CTRUNC) != 0 || self->frame_fds_.size() > max_fds) {
      // The kernel closed what did not fit; what did is closed with frame_fds_.
      self->frame_fds_.clear();
      self->Reject(self->error_reply_(absl::InvalidArgumentError(
          absl::StrCat("at most ", max_fds, " files may be passed with one frame"))));
      return;
    }
    if (n == 0) {
      self->frame_fds_.clear();
      self->Close(absl::OkStatus());
      return;
    }
    self->OnBytes(static_cast<size_t>(n));
  });
}

void FramedConnection::OnBytes(size_t n) {
  if (decoder_.buffered() == 0) {
    frame_started_ = absl::Now();
    frame_started_ns_ = base::MonotonicNowNs();
  }
  decoder_.Append(std::span<const uint8_t>(read_buffer_.data(), n));
  while (!closed_ && !close_after_writes_) {
    auto next = decoder_.Next();
    if (!next.ok()) {
      frame_fds_.clear();
      Reject(error_reply_(next.status()));
      return;
    }
    if (!next->has_value()) break;
    last_activity_ = absl::Now();
    handled_frame_started_ = frame_started_;
    handled_frame_ns_ = frame_started_ns_;
    frame_started_ = decoder_.buffered() > 0 ? last_activity_ : absl::InfiniteFuture();
    if (decoder_.buffered() > 0) frame_started_ns_ = base::MonotonicNowNs();
    // With fds, reads stop at the frame's end: these are this frame's, and only this frame's.
    std::vector<UniqueFd> fds = std::move(frame_fds_);
    frame_fds_.clear();
    on_frame_(*this, std::move(**next), std::move(fds));
    if (payload_done_ && !closed_ && !close_after_writes_) {
      // The handler announced a raw payload: it is part of this frame (its deadline too).
      frame_started_ = handled_frame_started_;
      ArmTimer();
      ReadPayload();
      return;
    }
  }
  if (closed_ || close_after_writes_) return;
  if (absl::Status held = UpdateHeld(); !held.ok()) {
    // Its partial frame is dropped first, so the error reply fits where the frame did not.
    decoder_.Discard();
    frame_fds_.clear();
    frame_started_ = absl::InfiniteFuture();
    (void)UpdateHeld();
    Reject(error_reply_(held));
    return;
  }
  ArmTimer();
  ReadMore();
}

absl::Status FramedConnection::UpdateHeld() {
  const size_t now = decoder_.buffered() + queued_bytes_;
  if (now == held_ || !limits_.held_bytes) {
    held_ = now;
    return absl::OkStatus();
  }
  if (absl::Status s = limits_.held_bytes(now); !s.ok() && now > held_) return s;
  held_ = now;
  return absl::OkStatus();
}

void FramedConnection::ArmTimer() {
  if (closed_) return;
  absl::Time due = absl::InfiniteFuture();
  if (close_after_writes_) {
    due = closing_since_ + kLinger;
  } else {
    if (frame_started_ != absl::InfiniteFuture() &&
        limits_.frame_timeout != absl::InfiniteDuration()) {
      due = frame_started_ + limits_.frame_timeout;
    }
    // Also part-way through a frame: before authenticating, a peer trickling a large frame is
    // held to its (short) allowance, not to the frame timeout.
    if (idle_policy_) {
      const absl::Duration idle = idle_policy_();
      if (idle != absl::InfiniteDuration()) due = std::min(due, last_activity_ + idle);
    }
  }
  if (due == armed_for_) return;
  armed_for_ = due;
  ++timer_generation_;
  timer_.cancel();
  if (due == absl::InfiniteFuture()) return;
  timer_.expires_after(
      absl::ToChronoNanoseconds(std::max(due - absl::Now(), absl::ZeroDuration())));
  timer_.async_wait(
      [self = shared_from_this(), generation = timer_generation_](const asio::error_code& ec) {
        // A handler already queued when the timer was re-armed runs without an error: ignored.
        if (ec || self->closed_ || generation != self->timer_generation_) return;
        self->armed_for_ = absl::InfiniteFuture();
        self->OnTimer();
      });
}

void FramedConnection::OnTimer() {
  const absl::Time now = absl::Now();
  if (close_after_writes_) {
    if (now >= closing_since_ + kLinger) {
      Close(absl::DeadlineExceededError(absl::StrCat(
          "the peer did not read its last replies within ", absl::FormatDuration(kLinger))));
    } else {
      ArmTimer();
    }
    return;
  }
  if (frame_started_ != absl::InfiniteFuture() && now >= frame_started_ + limits_.frame_timeout) {
    Reject(error_reply_(absl::DeadlineExceededError(
        absl::StrCat("a frame was not completed within ",
                     absl::FormatDuration(limits_.frame_timeout), " of its first byte"))));
    return;
  }
  if (idle_policy_) {
    const absl::Duration idle = idle_policy_();
    if (idle != absl::InfiniteDuration() && now >= last_activity_ + idle) {
      CloseAfterWrites(
          absl::DeadlineExceededError(absl::StrCat("no request for ", absl::FormatDuration(idle))));
      return;
    }
  }
  ArmTimer();
}

absl::Status FramedConnection::ReceivePayload(uint64_t bytes, uint8_t* into,
                                              std::shared_ptr<const void> keep,
                                              PayloadDone done) {
  if (payload_done_) return absl::FailedPreconditionError("a payload is already being received");
  if (bytes == 0 || bytes > limits_.max_payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a raw payload of ", bytes,
                                                   " bytes; this connection takes 1 to ",
                                                   limits_.max_payload_bytes));
  }
  payload_left_ = bytes;
  payload_into_ = into;
  payload_keep_ = std::move(keep);
  payload_done_ = std::move(done);
  return absl::OkStatus();
}

void FramedConnection::ReadPayload() {
  // Straight into the caller's memory; a dropped payload goes through the read buffer.
  uint8_t* dest = payload_into_ != nullptr ? payload_into_ : read_buffer_.data();
  const size_t want = payload_into_ != nullptr
                          ? static_cast<size_t>(payload_left_)
                          : static_cast<size_t>(std::min<uint64_t>(payload_left_,
                                                                   read_buffer_.size()));
  // The handler holds the destination: a read cancelled by a close completes (aborted) only
  // after the kernel can no longer write into it.
  socket_.async_read_some(asio::buffer(dest, want), [self = shared_from_this(),
                                                     keep = payload_keep_](
                                                        const asio::error_code& ec, size_t n) {
    if (self->closed_ || !self->payload_done_) return;
    if (ec) {
      self->Close(absl::UnavailableError(
          absl::StrCat("read failed with ", self->payload_left_,
                       " bytes of a raw payload still to come: ", ec.message())));
      return;
    }
    self->payload_left_ -= n;
    if (self->payload_into_ != nullptr) self->payload_into_ += n;
    if (self->payload_left_ > 0) {
      self->ReadPayload();
      return;
    }
    self->payload_into_ = nullptr;
    self->payload_keep_.reset();
    self->last_activity_ = absl::Now();
    self->frame_started_ = absl::InfiniteFuture();
    PayloadDone done = std::move(self->payload_done_);
    self->payload_done_ = nullptr;
    done(*self, absl::OkStatus());
    if (self->closed_ || self->close_after_writes_) return;
    self->ArmTimer();
    self->ReadMore();
  });
}

void FramedConnection::Send(std::vector<uint8_t> payload, UniqueFd fd) {
  Queue(std::move(payload), std::move(fd), {}, nullptr);
}

void FramedConnection::SendWithPayload(std::vector<uint8_t> payload,
                                       std::span<const uint8_t> raw,
                                       std::shared_ptr<const void> keep) {
  Queue(std::move(payload), UniqueFd(), raw, std::move(keep));
}

void FramedConnection::Queue(std::vector<uint8_t> payload, UniqueFd fd,
                             std::span<const uint8_t> raw, std::shared_ptr<const void> keep) {
  if (closed_) return;
  auto frame = EncodeFrame(payload, limits_.max_frame_bytes);
  if (!frame.ok()) {
    // Our own reply is too large: tell the peer rather than dropping it silently.
    auto error = EncodeFrame(error_reply_(frame.status()), limits_.max_frame_bytes);
    if (!error.ok()) {
      Close(frame.status());
      return;
    }
    frame = std::move(error);
    fd.Reset();
    raw = {};
    keep.reset();
  }
  const size_t cost = frame->size() + kQueuedFrameOverheadBytes;
  if (!outgoing_.empty() && queued_bytes_ + cost > limits_.max_queued_bytes) {
    // A peer that does not read its replies must not make us hold them without bound.
    Close(absl::ResourceExhaustedError(absl::StrCat(
        "the peer left ", queued_bytes_, " bytes of replies unread; connection closed")));
    return;
  }
  queued_bytes_ += cost;
  if (absl::Status held = UpdateHeld(); !held.ok()) {
    // Nor beyond what the server lets this peer hold in all (its share of a shared budget).
    queued_bytes_ -= cost;
    Close(absl::ResourceExhaustedError(
        absl::StrCat("a reply of ", frame->size(), " bytes does not fit: ", held.message())));
    return;
  }
  // `raw` is not counted here: it lies in memory its owner has charged already (a staging
  // region), and is not copied.
  outgoing_.push_back(Outgoing{std::move(*frame), std::move(fd), raw, std::move(keep)});
  last_activity_ = absl::Now();  // a reply: the peer may have waited for it, not idled
  WriteNext();
  ArmTimer();
}

void FramedConnection::Reject(std::vector<uint8_t> error_payload) {
  if (closed_) return;
  Send(std::move(error_payload));
  CloseAfterWrites(absl::InvalidArgumentError("closed after a bad frame"));
}

void FramedConnection::FailPayload(const absl::Status& why) {
  if (!payload_done_) return;
  PayloadDone done = std::move(payload_done_);
  payload_done_ = nullptr;
  payload_into_ = nullptr;
  payload_keep_.reset();
  payload_left_ = 0;
  done(*this, why.ok() ? absl::UnavailableError("the connection closed before its payload arrived")
                       : why);
}

void FramedConnection::CloseAfterWrites(const absl::Status& why) {
  if (closed_ || close_after_writes_) return;
  // No more is read: a payload under way never arrives.
  FailPayload(why);
  close_after_writes_ = true;
  close_after_writes_why_ = why;
  closing_since_ = absl::Now();
  WriteNext();
  ArmTimer();
}

void FramedConnection::WriteNext() {
  if (writing_ || closed_) return;
  if (outgoing_.empty()) {
    if (close_after_writes_) Close(close_after_writes_why_);
    return;
  }
  writing_ = true;
  Outgoing& front = outgoing_.front();
  auto done = [self = shared_from_this()](const asio::error_code& ec, size_t /*n*/) {
    self->writing_ = false;
    if (self->closed_) {
      self->outgoing_.clear();  // the frame the write was given is no longer in use
      return;
    }
    if (ec) {
      self->Close(absl::UnavailableError("write failed: " + ec.message()));
      return;
    }
    self->queued_bytes_ -= self->outgoing_.front().frame.size() + kQueuedFrameOverheadBytes;
    self->outgoing_.pop_front();
    (void)self->UpdateHeld();  // less than before: cannot fail
    self->WriteNext();
  };
  if (!front.raw.empty()) {
    // One scatter-gather write: the frame, then the raw bytes from where they lie.
    const std::array<asio::const_buffer, 2> buffers{asio::buffer(front.frame),
                                                    asio::buffer(front.raw.data(),
                                                                 front.raw.size())};
    asio::async_write(socket_, buffers, std::move(done));
    return;
  }
  if (!front.fd.valid()) {
    asio::async_write(socket_, asio::buffer(front.frame), std::move(done));
    return;
  }
  // Asio has no ancillary-data write: wait for writability, then sendmsg directly.
  socket_.async_wait(
      Socket::wait_write, [self = shared_from_this(), done](const asio::error_code& ec) mutable {
        if (ec) {
          done(ec, 0);
          return;
        }
        Outgoing& out = self->outgoing_.front();
        absl::Status sent = SendAllWithFd(self->socket_.native_handle(), out.frame, out.fd.get());
        done(sent.ok() ? asio::error_code() : asio::error::broken_pipe, 0);
      });
}

void FramedConnection::Close(const absl::Status& why) {
  if (closed_) return;
  closed_ = true;
  timer_.cancel();
  FailPayload(why);
  // What it held goes back now, not when the last handler lets the object go. A write in flight
  // keeps its frame until its handler runs, which the socket's close makes immediate.
  decoder_.Discard();
  frame_fds_.clear();
  while (outgoing_.size() > (writing_ ? 1u : 0u)) outgoing_.pop_back();
  queued_bytes_ = 0;
  (void)UpdateHeld();
  asio::error_code ignored;
  socket_.shutdown(Socket::shutdown_both, ignored);
  socket_.close(ignored);
  if (on_close_) on_close_(*this, why);
}

}  // namespace pswitch::proto
