// One worker child process: spawned with its control socket, commanded with framed
// WorkerCommands (queued, never blocking the sender: WorkerOutbox), heard through a reader
// thread, and reaped exactly once. A worker that dies (crash, abort, OOM kill) is reported
// through the event handler with how it died.
#ifndef PSWITCH_CONTROLLER_WORKER_PROCESS_H_
#define PSWITCH_CONTROLLER_WORKER_PROCESS_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/worker_outbox.h"
#include "proto/frame_channel.h"

namespace pswitch::controller {

struct WorkerSpawnOptions {
  std::string binary;  // pswitch-worker
  uint32_t worker_id = 0;
  std::string memdaemon_socket;
  std::string backend = "host";
  uint64_t activation_bytes = 0;  // each worker's arena lease for intermediate tensors
  int device_ordinal = 0;         // CUDA: the device holding the arena
  int cpu_threads = 0;            // its compute libraries' threads (base::CpuThreadsEnv); 0: all
  bool cut_training_steps = true;  // a Stop cuts a training step at its next layer
  // Issues the one-time secret with which the worker attaches the memdaemon's arena
  // (memdaemon::MemDaemon::IssueAttachSecret); it reaches the worker through an inherited pipe.
  // Unset: none (a memdaemon in this process's tests that admits the worker otherwise).
  std::function<absl::StatusOr<std::string>()> attach_secret;
};

// What a scheduler needs of one worker process: commands in, its pid, and a hard kill. Events
// come out through the handler it was launched with. WorkerProcess is the real one; the
// worker pool's tests use fakes.
class WorkerLink {
 public:
  virtual ~WorkerLink() = default;
  // Sends `command`, or queues it: never waits for the worker to read. ResourceExhausted when
  // the worker has left too much unread (its owner kills it); Unavailable when it is gone.
  virtual absl::Status Send(const flatbuffers::FlatBufferBuilder& command) = 0;
  // Sends `command` with `fd` (SCM_RIGHTS; the caller keeps its copy, the link holds its own
  // until the frame is sent). Links that cannot pass descriptors refuse.
  virtual absl::Status SendWithFd(const flatbuffers::FlatBufferBuilder& command, int fd) {
    if (fd < 0) return Send(command);
    return absl::UnimplementedError("this worker link cannot pass file descriptors");
  }
  virtual pid_t pid() const = 0;
  // SIGKILL, unless it was already reaped; its death reaches the handler like any other.
  virtual void Kill() = 0;
  // Since when commands have waited without the worker taking a byte of them (it stopped
  // reading its socket); InfiniteFuture while nothing waits.
  virtual absl::Time UnsentSince() const { return absl::InfiniteFuture(); }
};

// Thread-safe. The handler runs on the reader thread: with a verified WorkerEvent payload, or,
// once, with an error describing the process's death.
class WorkerProcess : public WorkerLink {
 public:
  using EventHandler =
      std::function<void(uint32_t worker_id, absl::StatusOr<std::vector<uint8_t>> event)>;

  static absl::StatusOr<std::unique_ptr<WorkerProcess>> Spawn(const WorkerSpawnOptions& options,
                                                              EventHandler handler);
  // Tests: runs `argv` (with "--control_fd=N" appended) as worker `id`, e.g. a peer that never
  // reads its socket.
  static absl::StatusOr<std::unique_ptr<WorkerProcess>> SpawnCommand(
      uint32_t id, std::vector<std::string> argv, EventHandler handler,
      OutboxLimits limits = OutboxLimits());
  // Asks the worker to shut down, kills it after a grace period, and reaps it.
  ~WorkerProcess();
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  absl::Status Send(const flatbuffers::FlatBufferBuilder& command) override;
  absl::Status SendWithFd(const flatbuffers::FlatBufferBuilder& command, int fd) override;
  uint32_t id() const { return id_; }
  pid_t pid() const override { return pid_; }
  void Kill() override;
  absl::Time UnsentSince() const override { return outbox_.UnsentSince(); }

 private:
  WorkerProcess(uint32_t id, pid_t pid, std::unique_ptr<proto::FrameChannel> channel,
                EventHandler handler, OutboxLimits limits);
  void ReadLoop();
  // Waits for the child (once) and describes how it ended.
  std::string Reap(absl::Duration grace);

  const uint32_t id_;
  const pid_t pid_;
  std::unique_ptr<proto::FrameChannel> channel_;
  EventHandler handler_;
  WorkerOutbox outbox_;  // writes to channel_'s socket; closed before the socket
  absl::Mutex reap_mu_;  // one Reap at a time
  bool reaped_ ABSL_GUARDED_BY(reap_mu_) = false;
  std::string exit_description_ ABSL_GUARDED_BY(reap_mu_);
  // Signals go through the pidfd, which names this process even after its pid was reaped and
  // reused; without one (kernel < 5.3) Kill falls back to kill(2) until the reap.
  const UniqueFd pidfd_;
  std::atomic<bool> reaped_flag_{false};
  std::thread reader_;
};


}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_WORKER_PROCESS_H_
