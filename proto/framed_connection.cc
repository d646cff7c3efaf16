#include "proto/framed_connection.h"

#include <utility>

#include "proto/frame_channel.h"

namespace pswitch::proto {

std::shared_ptr<FramedConnection> FramedConnection::Create(Socket socket, uint32_t max_frame_bytes,
                                                           FrameHandler on_frame,
                                                           ErrorReplyBuilder error_reply,
                                                           CloseHandler on_close) {
  return std::shared_ptr<FramedConnection>(
      new FramedConnection(std::move(socket), max_frame_bytes, std::move(on_frame),
                           std::move(error_reply), std::move(on_close)));
}

FramedConnection::FramedConnection(Socket socket, uint32_t max_frame_bytes, FrameHandler on_frame,
                                   ErrorReplyBuilder error_reply, CloseHandler on_close)
    : socket_(std::move(socket)),
      max_frame_bytes_(max_frame_bytes),
      on_frame_(std::move(on_frame)),
      error_reply_(std::move(error_reply)),
      on_close_(std::move(on_close)),
      decoder_(max_frame_bytes),
      read_buffer_(64 * 1024) {}

void FramedConnection::Start() { ReadMore(); }

void FramedConnection::ReadMore() {
  if (closed_ || close_after_writes_) return;
  socket_.async_read_some(asio::buffer(read_buffer_), [self = shared_from_this()](
                                                          const asio::error_code& ec, size_t n) {
    if (self->closed_) return;
    if (ec) {
      self->Close(ec == asio::error::eof ? absl::OkStatus()
                                         : absl::UnavailableError("read failed: " + ec.message()));
      return;
    }
    self->decoder_.Append(std::span<const uint8_t>(self->read_buffer_.data(), n));
    while (!self->closed_ && !self->close_after_writes_) {
      auto next = self->decoder_.Next();
      if (!next.ok()) {
        self->Reject(self->error_reply_(next.status()));
        return;
      }
      if (!next->has_value()) break;
      self->on_frame_(*self, std::move(**next));
    }
    self->ReadMore();
  });
}

void FramedConnection::Send(std::vector<uint8_t> payload, UniqueFd fd) {
  if (closed_) return;
  auto frame = EncodeFrame(payload, max_frame_bytes_);
  if (!frame.ok()) {
    // Our own reply is too large: tell the peer rather than dropping it silently.
    auto error = EncodeFrame(error_reply_(frame.status()), max_frame_bytes_);
    if (!error.ok()) {
      Close(frame.status());
      return;
    }
    frame = std::move(error);
    fd.Reset();
  }
  outgoing_.push_back(Outgoing{std::move(*frame), std::move(fd)});
  WriteNext();
}

void FramedConnection::Reject(std::vector<uint8_t> error_payload) {
  if (closed_) return;
  Send(std::move(error_payload));
  CloseAfterWrites(absl::InvalidArgumentError("closed after a bad frame"));
}

void FramedConnection::CloseAfterWrites(const absl::Status& why) {
  if (closed_ || close_after_writes_) return;
  close_after_writes_ = true;
  close_after_writes_why_ = why;
  WriteNext();
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
    if (self->closed_) return;
    if (ec) {
      self->Close(absl::UnavailableError("write failed: " + ec.message()));
      return;
    }
    self->outgoing_.pop_front();
    self->WriteNext();
  };
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
  asio::error_code ignored;
  socket_.shutdown(Socket::shutdown_both, ignored);
  socket_.close(ignored);
  if (on_close_) on_close_(*this, why);
}

}  // namespace pswitch::proto
