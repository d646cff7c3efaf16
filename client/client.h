// The pswitch client library: what users link to submit inference and training tasks to
// pswitchd, over its Unix socket when the server is local (tensors then travel through shared
// transfer areas, docs/dataplane.md) or over TCP. One connection, reused by every call; calls
// from many threads share it (requests carry ids, replies are matched to them), each synchronous
// call has a timeout, and errors come back as absl::Status with the server's code and message.
#ifndef PSWITCH_CLIENT_CLIENT_H_
#define PSWITCH_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "api/types.h"
#include "client/local_address.h"
#include "client/transfer_area.h"
#include "flatbuffers/flatbuffers.h"
#include "proto/framing.h"
#include "proto/host_tensor.h"

namespace pswitch::client {

// How Infer sends HostTensors over TCP.
enum class TcpFraming {
  // Inputs as a raw payload after the request's frame, written from the caller's buffers with
  // one writev; outputs back the same way, received straight into the result's tensors.
  kPayload,
  // Inputs copied into the request's FlatBuffer and outputs inside the reply (the old form,
  // kept as bench-dataplane's "tcp-framed" baseline).
  kInline,
};

struct ClientOptions {
  // Bound on every synchronous call, including waiting for a task's result.
  absl::Duration timeout = absl::Minutes(10);
  uint32_t max_frame_bytes = proto::kDefaultMaxFrameBytes;
  // The bearer token pswitchd's --auth-tokens file lists for this client; sent first on
  // connecting (Connect fails with Unauthenticated when pswitchd refuses it). Empty: none.
  std::string token;
  Transport transport = Transport::kAuto;
  TcpFraming tcp_framing = TcpFraming::kPayload;
  // The transfer areas of a Unix-socket connection: the first is registered on connecting; more
  // (each at least first_area_bytes) when the calls in flight and the results alive fill them,
  // up to these bounds (then ResourceExhausted). pswitchd bounds them too, per principal.
  AreaAllocatorOptions areas;
  // Over the Unix socket, open a fill job's dataset and create its output here, with this
  // process's rights and relative to its working directory, and pass them (FillJobOptions), so
  // pswitchd opens no path of the client's. Off: they are names under pswitchd's --data-root, as
  // over TCP (where they always are).
  bool pass_fill_files = true;
};

struct RegisterOptions {
  std::string name;          // the name tasks use
  std::string zoo_model;     // e.g. "resnet152"
  // Safetensors; empty = seeded random. Over TCP a path on the server's file system (needs
  // pswitchd's --allow-client-paths); over the Unix socket the client opens it (relative to its
  // own working directory, with its own rights) and passes the open file, as for archive_path
  // and plan.
  std::string weights_path;
  uint32_t batch_size = 1;
  std::string plan;  // grouping plan JSON path on the server, or "auto" (default)
  // Your own model: a TorchScript archive made by pswitch.export (Python); zoo_model stays
  // empty. Named and passed like weights_path.
  std::string archive_path;
  // Token names who may train the model in place and unload it besides admins; everyone else
  // trains a copy of their own (TrainOptions::as_model).
  std::vector<std::string> trainers;
  // A zoo model's precision: "float16" or "bfloat16" serve it in half the bytes (inputs and
  // outputs in that dtype too); empty: float32. An archive keeps the precision it was exported in.
  std::string dtype;
  // Set: told each phase (read, inspect, profile, plan, pin, load) as it ends, on the client's
  // reader thread, before Register returns (a progress line; keep it short).
  std::function<void(const std::string& phase, absl::Duration took)> on_phase;
  // Set: told while a long phase runs how far it has come ("inspect", 1.2 s so far, "profiling:
  // run 2 of 4"), on the same thread; on_phase still tells its end.
  std::function<void(const std::string& phase, absl::Duration so_far, const std::string& detail)>
      on_phase_progress;
  // Once its weights are resident on a GPU, they are never evicted there (the weights cache).
  bool pin_resident = false;
};

struct RegisteredModel {
  std::string name;
  uint32_t layers = 0;
  uint32_t groups = 0;
  uint64_t param_bytes = 0;
  // What each phase of the registration took, in order (read, inspect, profile, plan, pin,
  // load: docs/architecture.md).
  std::vector<std::pair<std::string, absl::Duration>> phases;
};

struct ModelInfo {
  std::string name;
  std::string zoo_model;
  uint64_t param_bytes = 0;
  // The model's output as recorded at registration; -1 marks the batch dimension. Empty shape:
  // not known (then outputs come back inline).
  proto::DType output_dtype = proto::DType::F32;
  std::vector<int64_t> output_shape;
  // The GPUs whose weights cache holds it now (a task there copies nothing).
  std::vector<uint32_t> resident_gpus;
};

struct InferOptions {
  int priority = 0;
  // From submission; zero = the server's maximum task time, which also caps this.
  absl::Duration deadline = absl::ZeroDuration();
  // Non-zero: online fill work, served in one of a main training job's pipeline bubbles within
  // this latency objective (from its arrival at pswitchd), so it never slows that job; if no
  // bubble can serve it in time, pswitchd runs it anyway or refuses it (DeadlineExceeded, with
  // the reason), as its operator chose (--online-fill-overflow). At most an hour.
  absl::Duration online_slo = absl::ZeroDuration();
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
  uint32_t batch = 0;     // samples per iteration; 0 = the batch the model was registered with
  // From submission; the task fails (weights saved) if unfinished by then. Zero: the server's
  // maximum task time, which also caps this.
  absl::Duration deadline = absl::ZeroDuration();
  // Non-empty: register a copy of the model under this new name, yours alone (only you and
  // admins see, serve, train and unload it), and train the copy. Empty: train the model itself,
  // which needs an admin token or one its configuration names as a trainer.
  std::string as_model;
};

// Where a task's server-side time went, each measured from its arrival at the scheduler on one
// clock; zero when the step did not happen (no switch, no preemption).
struct SwitchBreakdown {
  absl::Duration stop_sent;          // the old tenant was told to stop
  absl::Duration drained;            // the copy could start: the old tenant had drained
  absl::Duration first_group;        // the first group of the model was ready
  absl::Duration first_layer_start;  // the first layer's compute started (startup overhead)
  absl::Duration first_layer_done;
  absl::Duration last_group;  // the whole model was in place
  absl::Duration old_stopped;  // the old tenant answered its Stop (its step cut at a layer)
};

struct TaskResult {
  uint64_t task_id = 0;
  std::vector<proto::HostTensor> outputs;  // inference: "output"
  absl::Duration latency;                  // server-side, submission to completion
  // The model's copy (first group's copy start to last group ready); zero when it was resident.
  // Not the switch's cost: that is latency minus a ready model's latency, measured together.
  absl::Duration switch_time;
  SwitchBreakdown breakdown;
};

// An inference's result over the Unix socket: its outputs are views into the client's transfer
// area (no copy), valid while any AreaTensor of them lives; their space goes back to the client
// when the last one is destroyed. AreaTensor::ToHost copies one out.
struct AreaResult {
  uint64_t task_id = 0;
  std::vector<AreaTensor> outputs;
  absl::Duration latency;
  absl::Duration switch_time;
  SwitchBreakdown breakdown;
  // What the request named for its inputs (Place::Region descriptors): an area tensor passed in
  // is sent as its own slice, never copied.
  std::vector<proto::HostTensor> sent_inputs;
};

// The types clients and pswitchd share (api/types.h), under the client's names.
using api::TaskState;
using api::TaskStateName;
using api::TaskStatus;

// Fill jobs: work that runs only inside the main job's pipeline bubbles.
using api::FillJobStatus;
using api::FillKind;
using api::FillState;
using api::FillStateName;
using FillServerStats = api::FillStats;
struct FillJobOptions {
  FillKind kind = FillKind::kSynthetic;
  std::string model;         // zoo model (inference, training)
  // Inference: safetensors "input" rows, and the new file "output" is written to when the job
  // ends. Over the Unix socket (ClientOptions::pass_fill_files, the default) the client opens the
  // dataset and creates the output itself (relative to its own working directory; never over an
  // existing file, and removed again if the job is refused) and passes the open files; over TCP
  // they are names on the server, relative to pswitchd's --data-root.
  std::string dataset_path;
  std::string output_path;
  uint32_t batch = 1;
  uint32_t steps = 0;  // training iterations / synthetic steps
  uint64_t seed = 0;
  absl::Duration step;        // profiled step duration (synthetic: defaults to synthetic_step)
  uint64_t memory_bytes = 0;  // memory cap; allocations beyond it fail
  absl::Duration deadline = absl::ZeroDuration();  // from submission; zero = none
  absl::Duration synthetic_step;
  uint64_t synthetic_alloc_bytes = 0;
  bool ignore_pause = false;  // tests: a misbehaving task the framework must kill
};

// Thread-safe. Destroying the client fails calls still in flight with Unavailable.
class Client {
 public:
  // `address`:
  //  - "unix:/path": pswitchd's Unix socket at /path;
  //  - "" : the first default Unix socket (DefaultUnixSocketPaths) that accepts the
  //    connection, else TCP to 127.0.0.1:7300;
  //  - "HOST:PORT": TCP, except that a loopback HOST ("localhost", 127.0.0.0/8, "::1") with the
  //    default port 7300 uses the default Unix socket when it exists and accepts the connection
  //    (the same local pswitchd). Another port always means TCP: it may be another pswitchd.
  // options.transport = kTcp never uses the Unix socket. Over the Unix socket the client
  // registers its first transfer area before returning.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(absl::string_view address,
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
  // Over the Unix socket the inputs are copied once into the transfer area and the outputs once
  // out of it; over TCP they travel in the frame.
  // Synchronous forms: DeadlineExceeded after the client's timeout.
  absl::StatusOr<TaskResult> Infer(const std::string& model, std::vector<proto::HostTensor> inputs,
                                   const InferOptions& options = {});
  absl::StatusOr<TaskResult> Train(const std::string& model, const TrainOptions& options);

  // --- The local data plane (Unix socket only; FailedPrecondition over TCP) ---
  // Whether this client talks to pswitchd over its Unix socket, with transfer areas.
  bool local() const { return areas_ != nullptr; }
  // A `dtype` tensor of `shape` in the transfer area, for the caller to fill in place (contents
  // unspecified); passing it to InferArea sends its slice only. ResourceExhausted at the bounds.
  absl::StatusOr<AreaTensor> Tensor(std::vector<int64_t> shape, proto::DType dtype,
                                    std::string name = "input");
  // `tensor`'s bytes copied into a new area tensor (one copy).
  absl::StatusOr<AreaTensor> CopyToArea(const proto::HostTensor& tensor);
  // Inference on area tensors: requests carry their slices only, and the outputs are written
  // by the worker into a span of the area sized from the model's output spec (ModelInfo,
  // fetched once per model; -1 = the first input's batch). The inputs' spans stay held until
  // pswitchd's final answer, even past a timeout, so nothing reuses bytes a worker may still
  // read or write.
  std::future<absl::StatusOr<AreaResult>> InferAreaAsync(const std::string& model,
                                                         std::vector<AreaTensor> inputs,
                                                         const InferOptions& options = {});
  absl::StatusOr<AreaResult> InferArea(const std::string& model, std::vector<AreaTensor> inputs,
                                       const InferOptions& options = {});
  // The allocator of the transfer areas (null over TCP): the Python package finds the area
  // tensor behind an array with it; tests read its figures.
  AreaAllocator* areas() const { return areas_.get(); }

  absl::StatusOr<TaskStatus> Status(uint64_t task_id);
  // The `limit` most recent tasks, newest first (0 = as many as the server lists, 1000).
  absl::StatusOr<std::vector<TaskStatus>> ListTasks(uint32_t limit = 0);
  absl::Status Cancel(uint64_t task_id);
  // Unloads a registered model (an admin, its trainers, or a copy's owner): its queued tasks
  // fail, a running inference batch finishes, a running training task is cancelled; returns once
  // its weights are freed.
  absl::Status Unload(const std::string& name);

  // The bubble instruction, called by the main job around each idle wait of GPU (stage) `gpu`.
  // One send each: the call does not wait for the server. A failure (connection lost, an error
  // reply) is returned by this and every later bubble call. `began_ns`: when the bubble began
  // (CLOCK_MONOTONIC on this node; 0: now); the server ends it `expected` after that, so a
  // message handled late gives fill work less time, never more.
  absl::Status BubbleBegin(uint32_t gpu, absl::Duration expected, uint64_t free_bytes,
                           int64_t began_ns = 0);
  absl::Status BubbleEnd(uint32_t gpu);
  // The GPU's repeating bubble cycle (fill/bubble_cycle.h JSON), measured by profiling.
  // `origin_ns`: CLOCK_MONOTONIC time of one iteration's start (0: the time of registration),
  // which anchors the server's completion predictions to the main job's real phase.
  absl::Status RegisterBubbleCycle(uint32_t gpu, const std::string& cycle_json,
                                   int64_t origin_ns = 0);
  absl::StatusOr<FillJobStatus> SubmitFill(const FillJobOptions& options);
  // The GPU and predicted completion a SubmitFill of `options` would get now (job_id 0,
  // state kSubmitted); nothing is submitted.
  absl::StatusOr<FillJobStatus> EstimateFill(const FillJobOptions& options);
  // Stops the job; NotFound for an unknown job, FailedPrecondition for one already stopped.
  absl::Status CancelFill(uint64_t job_id);
  absl::StatusOr<FillJobStatus> FillStatus(uint64_t job_id);
  absl::StatusOr<FillServerStats> FillStats();

 private:
  // Presents `token` (pswitchd's Authenticate); Unauthenticated when refused.
  absl::Status Authenticate(const std::string& token);
  class Connection;
  Client(std::unique_ptr<Connection> connection, const ClientOptions& options, bool local);

  absl::Status SendBubble(
      const std::function<void(flatbuffers::FlatBufferBuilder&, uint64_t)>& build);
  // A request answered by Ack (or an error): waits for it within the client's timeout.
  absl::Status AckCall(std::function<void(flatbuffers::FlatBufferBuilder&, uint64_t)> build,
                       const char* what);
  // Registers `area` with pswitchd (RegisterArea with its fd); the id it gave.
  absl::StatusOr<uint64_t> RegisterArea(const TransferArea& area);
  struct OutputSpec {
    proto::DType dtype = proto::DType::F32;
    std::vector<int64_t> shape;  // empty: unknown
  };
  // `model`'s output spec, from the cache or ListModels.
  absl::StatusOr<OutputSpec> OutputSpecOf(const std::string& model);
  void ForgetOutputSpec(const std::string& model);
  // The space for `model`'s outputs given `inputs` (from its output spec); null when the spec
  // is unknown (the outputs then come inline).
  absl::StatusOr<std::shared_ptr<AreaSpan>> AllocateOutputs(const std::string& model,
                                                            const std::vector<AreaTensor>& inputs);
  // Submits an area inference (SendArea with AllocateOutputs' space); `done` gets its outcome
  // (on the connection's reader thread, or on this one when it fails before sending).
  void SubmitArea(const std::string& model, std::vector<AreaTensor> inputs,
                  const InferOptions& options,
                  std::function<void(absl::StatusOr<AreaResult>)> done);
  void SendArea(const std::string& model, std::vector<AreaTensor> inputs,
                std::shared_ptr<AreaSpan> outputs, const InferOptions& options,
                std::function<void(absl::StatusOr<AreaResult>)> done);

  const ClientOptions options_;
  absl::Mutex bubble_mu_;
  absl::Status bubble_error_ ABSL_GUARDED_BY(bubble_mu_);  // sticky
  absl::Mutex specs_mu_;
  absl::flat_hash_map<std::string, OutputSpec> output_specs_ ABSL_GUARDED_BY(specs_mu_);
  std::shared_ptr<AreaAllocator> areas_;    // Unix socket only; spans out may outlive the client
  std::unique_ptr<Connection> connection_;  // last: its reader may call into the above
};

}  // namespace pswitch::client

#endif  // PSWITCH_CLIENT_CLIENT_H_
