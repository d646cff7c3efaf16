// The commands on their way to one worker process, sent without ever blocking the sender.
//
// Design (issue 26 item 5): the scheduler's loop must never wait on a worker, yet a worker's
// control socket holds only a few hundred kilobytes and a wedged or stopped worker never drains
// it. So Send never waits: when nothing is queued it offers the frame to the socket itself with
// one non-blocking sendmsg (a Run is descriptors only, so it almost always fits whole, and then
// costs no hand-over to another thread); whatever the socket did not take is queued (the payload
// copied, a passed fd dup'ed unless it already travelled with the first byte) and Send returns.
// One writer thread per worker drains the queue into the socket with non-blocking
// scatter-gather sendmsg (header + payload, no framing copy), waiting for writability with poll
// between partial writes. The queue is bounded in bytes and frames: past the bound Send refuses
// (ResourceExhausted) and the owner kills the worker. A worker that takes no byte for a while is
// visible through UnsentSince, which the pool's watchdog checks beside the heartbeat
// (WorkerPool::KillSilent).
#ifndef PSWITCH_CONTROLLER_WORKER_OUTBOX_H_
#define PSWITCH_CONTROLLER_WORKER_OUTBOX_H_

#include <array>
#include <cstdint>
#include <deque>
#include <span>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"
#include "proto/framing.h"

namespace pswitch::controller {

struct OutboxLimits {
  // Bytes queued and not yet taken by the socket (a frame the kernel took part of counts whole
  // until the rest is taken).
  size_t max_bytes = size_t{128} << 20;
  size_t max_frames = 4096;
};

// Thread-safe: any thread may Send.
class WorkerOutbox {
 public:
  // `socket` is borrowed: a connected stream socket that must stay open until the destructor
  // (or Close) has returned.
  WorkerOutbox(int socket, OutboxLimits limits);
  // Close.
  ~WorkerOutbox();
  WorkerOutbox(const WorkerOutbox&) = delete;
  WorkerOutbox& operator=(const WorkerOutbox&) = delete;

  // Queues one frame of `payload`, with `fd_to_pass` (if >= 0; the caller keeps its own copy)
  // attached to its first byte. Never blocks on the peer. InvalidArgument for an empty or
  // oversize payload; ResourceExhausted (nothing queued) when the frame would take the backlog
  // past its limits; Unavailable once the socket failed or the outbox closed.
  absl::Status Send(std::span<const uint8_t> payload, int fd_to_pass);
  // Since when queued frames have waited without the peer taking a byte of them:
  // InfiniteFuture while nothing waits.
  absl::Time UnsentSince() const;
  // Bytes queued and not yet taken.
  size_t queued_bytes() const;
  // Stops the writer and drops what it has not sent (their fds are closed). Idempotent; not
  // concurrently with itself (the owner's destructor calls it).
  void Close();

 private:
  struct Frame {
    std::array<uint8_t, proto::kFrameHeaderBytes> header;
    std::vector<uint8_t> payload;
    UniqueFd fd;
    size_t sent = 0;  // bytes of header + payload Send already wrote itself
  };
  void WriteLoop();
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closing_ || !queue_.empty(); }
  // Sends `frame` whole; false when the socket failed or the outbox is closing.
  bool WriteFrame(const Frame& frame);

  const int socket_;
  const OutboxLimits limits_;
  const UniqueFd wake_;  // an eventfd: Close wakes the writer out of its poll with it

  mutable absl::Mutex mu_;
  // The writer sends the front frame outside the lock: a deque keeps it in place while Send
  // pushes at the back.
  std::deque<Frame> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // When the peer last took bytes, or the queue last became non-empty.
  absl::Time progress_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);

  std::thread writer_;  // last: started once everything above exists
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_WORKER_OUTBOX_H_
