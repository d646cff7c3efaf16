#include "controller/worker_process.h"

#include <fcntl.h>
#include <poll.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/child_process.h"
#include "base/status.h"
#include "proto/framing.h"
#include "proto/worker_generated.h"

namespace pswitch::controller {


absl::StatusOr<std::unique_ptr<WorkerProcess>> WorkerProcess::Spawn(
    const WorkerSpawnOptions& options, EventHandler handler) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoStatus("socketpair for worker");
  }
  UniqueFd parent_end(sv[0]), child_end(sv[1]);
  // The attach secret, through a pipe only this child inherits (argv and the environment are
  // readable by every process of this user).
  UniqueFd secret_read;
  if (options.attach_secret) {
    PSWITCH_ASSIGN_OR_RETURN(std::string secret, options.attach_secret());
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return ErrnoStatus("pipe for a worker's attach secret");
    secret_read = UniqueFd(p[0]);
    UniqueFd secret_write(p[1]);
    // A pipe's buffer holds 32 bytes: the write completes before the child exists.
    if (::write(secret_write.get(), secret.data(), secret.size()) !=
        static_cast<ssize_t>(secret.size())) {
      return ErrnoStatus("writing a worker's attach secret");
    }
  }
  std::vector<std::string> args = {
      options.binary,
      absl::StrCat("--worker_id=", options.worker_id),
      absl::StrCat("--control_fd=", child_end.get()),
      absl::StrCat("--memdaemon_socket=", options.memdaemon_socket),
      absl::StrCat("--backend=", options.backend),
      absl::StrCat("--activation_bytes=", options.activation_bytes),
      absl::StrCat("--device=", options.device_ordinal),
      absl::StrCat("--cut_training_steps=", options.cut_training_steps ? "true" : "false")};
  std::vector<int> inherit = {child_end.get()};
  if (secret_read.valid()) {
    args.push_back(absl::StrCat("--attach_secret_fd=", secret_read.get()));
    inherit.push_back(secret_read.get());
  }
  PSWITCH_ASSIGN_OR_RETURN(pid_t pid,
                           base::SpawnChild({.argv = std::move(args),
                                             .inherit_fds = std::move(inherit),
                                             .env = base::CpuThreadsEnv(options.cpu_threads)}));
  child_end.Reset();
  secret_read.Reset();
  return std::unique_ptr<WorkerProcess>(new WorkerProcess(
      options.worker_id, pid, std::make_unique<proto::FrameChannel>(std::move(parent_end)),
      std::move(handler), OutboxLimits()));
}

absl::StatusOr<std::unique_ptr<WorkerProcess>> WorkerProcess::SpawnCommand(
    uint32_t id, std::vector<std::string> argv, EventHandler handler, OutboxLimits limits) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoStatus("socketpair for worker");
  }
  UniqueFd parent_end(sv[0]), child_end(sv[1]);
  argv.push_back(absl::StrCat("--control_fd=", child_end.get()));
  PSWITCH_ASSIGN_OR_RETURN(
      pid_t pid, base::SpawnChild({.argv = std::move(argv), .inherit_fds = {child_end.get()}}));
  child_end.Reset();
  return std::unique_ptr<WorkerProcess>(
      new WorkerProcess(id, pid, std::make_unique<proto::FrameChannel>(std::move(parent_end)),
                        std::move(handler), limits));
}

WorkerProcess::WorkerProcess(uint32_t id, pid_t pid, std::unique_ptr<proto::FrameChannel> channel,
                             EventHandler handler, OutboxLimits limits)
    : id_(id),
      pid_(pid),
      channel_(std::move(channel)),
      handler_(std::move(handler)),
      outbox_(channel_->fd(), limits),
      pidfd_(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0))),
      reader_([this] { ReadLoop(); }) {}

WorkerProcess::~WorkerProcess() {
  flatbuffers::FlatBufferBuilder b;
  auto body = proto::CreateShutdown(b);
  proto::Finish(b, proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::Shutdown, body.Union()));
  (void)Send(b);
  // The writer sends the Shutdown while the child winds down; one that never reads it is killed
  // after the grace period, which ends the writer's wait too (the peer is gone).
  Reap(absl::Seconds(5));
  outbox_.Close();
  ::shutdown(channel_->fd(), SHUT_RDWR);
  reader_.join();
}

absl::Status WorkerProcess::Send(const flatbuffers::FlatBufferBuilder& command) {
  return SendWithFd(command, -1);
}

absl::Status WorkerProcess::SendWithFd(const flatbuffers::FlatBufferBuilder& command, int fd) {
  absl::Status sent =
      outbox_.Send(std::span<const uint8_t>(command.GetBufferPointer(), command.GetSize()), fd);
  if (!sent.ok()) {
    return absl::Status(sent.code(), absl::StrCat("worker ", id_, ": ", sent.message()));
  }
  return sent;
}

void WorkerProcess::Kill() {
  if (pidfd_.valid()) {
    (void)::syscall(SYS_pidfd_send_signal, pidfd_.get(), SIGKILL, nullptr, 0);
  } else if (!reaped_flag_.load()) {
    ::kill(pid_, SIGKILL);
  }
}

std::string WorkerProcess::Reap(absl::Duration grace) {
  absl::MutexLock lock(&reap_mu_);
  if (reaped_) return exit_description_;
  int status = 0;
  // The child's pidfd becomes readable when it exits: a bounded wait with no polling. A
  // process that outlives `grace` is killed (SIGKILL cannot be ignored) and then reaped.
  if (pidfd_.valid()) {
    pollfd exited{pidfd_.get(), POLLIN, 0};
    int ready;
    const absl::Time deadline = absl::Now() + grace;
    do {
      const int ms = static_cast<int>(
          std::max<int64_t>(absl::ToInt64Milliseconds(deadline - absl::Now()), 0));
      ready = ::poll(&exited, 1, ms);
    } while (ready < 0 && errno == EINTR);
    if (ready != 1) Kill();
  } else {
    ::kill(pid_, SIGKILL);  // no pidfd (kernel < 5.3): no bounded wait to offer
  }
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_flag_.store(true);
  reaped_ = true;
  exit_description_ = base::DescribeExit(status);
  return exit_description_;
}

void WorkerProcess::ReadLoop() {
  while (true) {
    absl::StatusOr<proto::ReceivedFrame> frame = channel_->Receive();
    if (!frame.ok()) break;
    auto event = proto::VerifyPayload<proto::WorkerEvent>(frame->payload, "worker event");
    if (!event.ok()) {
      ::kill(pid_, SIGKILL);  // a worker that speaks garbage is broken
      break;
    }
    handler_(id_, std::move(frame->payload));
  }
  // The control socket closed: the worker is exiting or dead.
  std::string how = Reap(absl::Seconds(5));
  handler_(id_, absl::UnavailableError(absl::StrCat("worker ", id_, " (pid ", pid_, ") ", how)));
}

}  // namespace pswitch::controller
