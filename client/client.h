// The pswitch client library: what users link to submit inference and training tasks to
// pswitchd over TCP. One connection, reused by every call; calls from many threads share it
// (requests carry ids, replies are matched to them), each synchronous call has a timeout, and
// errors come back as absl::Status with the server's code and message.
#ifndef PSWITCH_CLIENT_CLIENT_H_
#define PSWITCH_CLIENT_CLIENT_H_

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/framing.h"
#include "proto/host_tensor.h"

namespace pswitch::client {

struct ClientOptions {
  // Bound on every synchronous call, including waiting for a task's result.
  absl::Duration timeout = absl::Minutes(10);
  uint32_t max_frame_bytes = proto::kDefaultMaxFrameBytes;
};

struct RegisterOptions {
  std::string name;          // the name tasks use
  std::string zoo_model;     // e.g. "resnet152"
  std::string weights_path;  // safetensors on the server's file system; empty = seeded random
  uint32_t batch_size = 1;
  std::string plan;  // grouping plan JSON path on the server, or "auto" (default)
};

struct RegisteredModel {
  std::string name;
  uint32_t layers = 0;
  uint32_t groups = 0;
  uint64_t param_bytes = 0;
};

struct ModelInfo {
  std::string name;
  std::string zoo_model;
  uint64_t param_bytes = 0;
};

struct InferOptions {
  int priority = 0;
  absl::Duration deadline = absl::ZeroDuration();  // from submission; zero = none
};

enum class Optimizer { kSgd, kAdam };

struct TrainOptions {
  uint32_t iterations = 1;
  uint64_t seed = 0;
  int priority = 0;
  // The optimizer's state (momentum, Adam moments) survives preemptions like the weights.
  Optimizer optimizer = Optimizer::kSgd;
  double learning_rate = 0.01;
  double momentum = 0.9;  // SGD only; 0 = plain SGD
};

struct TaskResult {
  uint64_t task_id = 0;
  std::vector<proto::HostTensor> outputs;  // inference: "output"
  absl::Duration latency;                  // server-side, submission to completion
  absl::Duration switch_time;              // part of it spent switching models
};

enum class TaskState { kQueued, kSwitching, kRunning, kSucceeded, kFailed, kCancelled };

struct TaskStatus {
  uint64_t task_id = 0;
  std::string model;
  TaskState state = TaskState::kQueued;
  uint32_t iterations_done = 0;
  uint32_t preemptions = 0;  // training: times stopped for another task and resumed
  int worker_pid = 0;        // the worker process running it (0 when not running)
  absl::Status error;        // for kFailed
  // The worker's cleaning after the task's last run, and whether it ran after the drain (so it
  // overlapped the next switch); zero until that worker has drained.
  absl::Duration clean_time;
  bool cleaned_after_drain = false;
};

absl::string_view TaskStateName(TaskState state);

// Thread-safe. Destroying the client fails calls still in flight with Unavailable.
class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(absl::string_view host_port,
                                                         const ClientOptions& options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  absl::StatusOr<RegisteredModel> Register(const RegisterOptions& options);
  absl::StatusOr<std::vector<ModelInfo>> ListModels();

  // Asynchronous submission: the future resolves when the task finishes (or fails).
  std::future<absl::StatusOr<TaskResult>> InferAsync(const std::string& model,
                                                     std::vector<proto::HostTensor> inputs,
                                                     const InferOptions& options = {});
  std::future<absl::StatusOr<TaskResult>> TrainAsync(const std::string& model,
                                                     const TrainOptions& options);
  // Synchronous forms: DeadlineExceeded after the client's timeout.
  absl::StatusOr<TaskResult> Infer(const std::string& model, std::vector<proto::HostTensor> inputs,
                                   const InferOptions& options = {});
  absl::StatusOr<TaskResult> Train(const std::string& model, const TrainOptions& options);

  absl::StatusOr<TaskStatus> Status(uint64_t task_id);
  absl::Status Cancel(uint64_t task_id);

 private:
  class Connection;
  explicit Client(std::unique_ptr<Connection> connection, const ClientOptions& options);

  const ClientOptions options_;
  std::unique_ptr<Connection> connection_;
};

}  // namespace pswitch::client

#endif  // PSWITCH_CLIENT_CLIENT_H_
