// Drains one incoming stage link on a thread of its own, so that a stage's sends never block on
// a neighbour that is busy computing: sends complete at once, as NCCL's asynchronous sends do,
// and the simulator's zero-communication-time model holds. The compute thread then takes
// messages in FIFO order and can tell, before it blocks, whether it is about to wait (a bubble).
//
// Thread-safe: one reader thread fills the queue, any thread may take from it.
#ifndef PSWITCH_PIPELINE_LINK_READER_H_
#define PSWITCH_PIPELINE_LINK_READER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pipeline/wire.h"

namespace pswitch::pipeline {

class LinkReader {
 public:
  // Starts reading `fd`, which must stay open until the reader is destroyed. `name` ("link from
  // stage 1") prefixes errors. A message above `max_payload_bytes`, or more than `max_queued`
  // unread messages (a peer that floods), fails the link.
  LinkReader(int fd, std::string name, uint64_t max_payload_bytes, size_t max_queued);
  // Shuts the socket's read side (the peer's sends then fail) and joins the thread.
  ~LinkReader();
  LinkReader(const LinkReader&) = delete;
  LinkReader& operator=(const LinkReader&) = delete;

  // True when a message is queued: Take will not block.
  bool HasMessage() const;

  // The oldest queued message. Once the queue is empty and the link has failed (peer closed:
  // Unavailable; bad message: InvalidArgument), that error, prefixed with the link's name.
  // DeadlineExceeded after `timeout` without a message.
  absl::StatusOr<Message> Take(absl::Duration timeout);

 private:
  void ReadLoop();

  const int fd_;
  const std::string name_;
  const uint64_t max_payload_bytes_;
  const size_t max_queued_;

  mutable absl::Mutex mu_;
  std::deque<Message> queue_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // set once, when the link fails

  std::thread thread_;  // last: starts after every member it uses is constructed
};

}  // namespace pswitch::pipeline

#endif  // PSWITCH_PIPELINE_LINK_READER_H_
