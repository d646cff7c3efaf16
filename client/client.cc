#include "client/client.h"

#include <sys/socket.h>

#include <functional>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "api/client_codec.h"
#include "base/clock.h"
#include "base/status.h"
#include "proto/framing.h"
#include "proto/client_generated.h"
#include "proto/frame_channel.h"
#include "proto/wire_status.h"

namespace pswitch::client {
namespace {

using proto::ControllerReply;
using proto::ControllerReplyBody;
using Builder = flatbuffers::FlatBufferBuilder;
// Gets every reply for one request; returns true when it was the last one.
using ReplyHandler = std::function<bool(const absl::StatusOr<const ControllerReply*>&)>;

absl::Status ReplyError(const ControllerReply* reply) {
  return proto::FromWireError(reply->body_as_Error());
}

TaskResult ToResult(const proto::TaskResult& wire, std::vector<proto::HostTensor> outputs) {
  TaskResult result;
  result.task_id = wire.task_id();
  result.outputs = std::move(outputs);
  result.latency = absl::Microseconds(wire.latency_us());
  result.switch_time = absl::Microseconds(wire.switch_us());
  result.breakdown.stop_sent = absl::Microseconds(wire.stop_sent_us());
  result.breakdown.drained = absl::Microseconds(wire.drained_us());
  result.breakdown.first_group = absl::Microseconds(wire.first_group_us());
  result.breakdown.first_layer_start = absl::Microseconds(wire.first_layer_start_us());
  result.breakdown.first_layer_done = absl::Microseconds(wire.first_layer_done_us());
  result.breakdown.last_group = absl::Microseconds(wire.last_group_us());
  return result;
}

}  // namespace

// The socket, a reader thread, and the table of requests awaiting replies.
class Client::Connection {
 public:
  explicit Connection(std::unique_ptr<proto::FrameChannel> channel)
      : channel_(std::move(channel)), reader_([this] { ReadLoop(); }) {}

  ~Connection() {
    ::shutdown(channel_->fd(), SHUT_RDWR);  // unblocks the reader
    reader_.join();
  }

  // Sends the request `build` makes (given its id); `handler` gets every reply to it.
  void Call(const std::function<void(Builder&, uint64_t)>& build, ReplyHandler handler) {
    Builder b;
    uint64_t id;
    absl::Status closed;
    {
      absl::MutexLock lock(&mu_);
      closed = closed_;
      if (closed.ok()) {
        id = next_id_++;
        pending_[id] = handler;
      }
    }
    if (!closed.ok()) {
      handler(closed);
      return;
    }
    build(b, id);
    absl::Status sent;
    {
      absl::MutexLock lock(&send_mu_);
      sent = channel_->Send(b);
    }
    if (!sent.ok()) Complete(id, sent);
  }

  void Forget(uint64_t id) {
    absl::MutexLock lock(&mu_);
    pending_.erase(id);
  }

 private:
  void Complete(uint64_t id, const absl::StatusOr<const ControllerReply*>& reply) {
    ReplyHandler handler;
    {
      absl::MutexLock lock(&mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return;  // timed out and forgotten
      handler = it->second;
    }
    if (handler(reply)) Forget(id);
  }

  void ReadLoop() {
    absl::Status why;
    while (true) {
      absl::StatusOr<proto::ReceivedFrame> frame = channel_->Receive();
      if (!frame.ok()) {
        why = absl::UnavailableError(
            absl::StrCat("connection to pswitchd lost: ", frame.status().message()));
        break;
      }
      auto reply = proto::VerifyPayload<ControllerReply>(frame->payload, "controller reply");
      if (!reply.ok()) {
        why = reply.status();
        break;
      }
      // Request id 0 is the server's answer to a frame it could not read: it closes next.
      if ((*reply)->request_id() == 0 && (*reply)->body_type() == ControllerReplyBody::Error) {
        why = ReplyError(*reply);
        break;
      }
      Complete((*reply)->request_id(), *reply);
    }
    absl::flat_hash_map<uint64_t, ReplyHandler> orphans;
    {
      absl::MutexLock lock(&mu_);
      closed_ = why;
      orphans.swap(pending_);
    }
    for (auto& [id, handler] : orphans) handler(why);
  }

  std::unique_ptr<proto::FrameChannel> channel_;
  absl::Mutex send_mu_;
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, ReplyHandler> pending_ ABSL_GUARDED_BY(mu_);
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
  std::thread reader_;  // last: starts once the members it uses exist
};

Client::Client(std::unique_ptr<Connection> connection, const ClientOptions& options)
    : options_(options), connection_(std::move(connection)) {}

Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(absl::string_view host_port,
                                                        const ClientOptions& options) {
  PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<proto::FrameChannel> channel,
                           proto::FrameChannel::ConnectTcp(host_port, options.max_frame_bytes));
  std::unique_ptr<Client> client(
      new Client(std::make_unique<Connection>(std::move(channel)), options));
  if (!options.token.empty()) PSWITCH_RETURN_IF_ERROR(client->Authenticate(options.token));
  return client;
}

namespace {

// Waits for `future` up to `timeout`.
template <typename T>
absl::StatusOr<T> Await(std::future<absl::StatusOr<T>>& future, absl::Duration timeout,
                        absl::string_view what) {
  if (future.wait_for(absl::ToChronoNanoseconds(timeout)) != std::future_status::ready) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": no reply from pswitchd within ", absl::FormatDuration(timeout)));
  }
  return future.get();
}

// A one-reply call whose reply body must be `expected`; `parse` turns it into T. Waits up to
// `timeout` for the reply.
template <typename T, typename Connection>
absl::StatusOr<T> CallAndAwait(Connection& connection, absl::Duration timeout,
                               absl::string_view what,
                               const std::function<void(Builder&, uint64_t)>& build,
                               ControllerReplyBody expected,
                               std::function<absl::StatusOr<T>(const ControllerReply*)> parse) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<T>>>();
  auto future = promise->get_future();
  connection.Call(build, [promise, expected, parse = std::move(parse)](
                             const absl::StatusOr<const ControllerReply*>& reply) {
    if (!reply.ok()) {
      promise->set_value(reply.status());
    } else if ((*reply)->body_type() == ControllerReplyBody::Error) {
      promise->set_value(ReplyError(*reply));
    } else if ((*reply)->body_type() != expected) {
      promise->set_value(absl::InternalError(absl::StrCat(
          "unexpected reply ", proto::EnumNameControllerReplyBody((*reply)->body_type()))));
    } else {
      promise->set_value(parse(*reply));
    }
    return true;
  });
  return Await(future, timeout, what);
}

}  // namespace

absl::Status Client::Authenticate(const std::string& token) {
  return CallAndAwait<bool>(*connection_, options_.timeout, "authenticate",
      [&](Builder& b, uint64_t id) {
        auto body = proto::CreateAuthenticate(b, b.CreateString(token));
        proto::Finish(b, proto::CreateClientRequest(b, id, proto::ClientRequestBody::Authenticate,
                                            body.Union()));
      },
      ControllerReplyBody::Ack,
      [](const ControllerReply*) -> absl::StatusOr<bool> { return true; }).status();
}

absl::StatusOr<RegisteredModel> Client::Register(const RegisterOptions& options) {
  return CallAndAwait<RegisteredModel>(*connection_, options_.timeout, "register",
      [&](Builder& b, uint64_t id) {
        auto body = proto::CreateRegisterModel(
            b, b.CreateString(options.name), b.CreateString(options.zoo_model),
            b.CreateString(options.weights_path), options.batch_size,
            b.CreateString(options.plan.empty() ? "auto" : options.plan),
            b.CreateString(options.archive_path),
            options.trainers.empty() ? 0 : b.CreateVectorOfStrings(options.trainers));
        proto::Finish(b, proto::CreateClientRequest(b, id, proto::ClientRequestBody::RegisterModel,
                                            body.Union()));
      },
      ControllerReplyBody::Registered,
      [](const ControllerReply* reply) -> absl::StatusOr<RegisteredModel> {
        auto* r = reply->body_as_Registered();
        return RegisteredModel{r->name() ? r->name()->str() : "", r->layers(), r->groups(),
                               r->param_bytes()};
      });
}

absl::StatusOr<std::vector<ModelInfo>> Client::ListModels() {
  return CallAndAwait<std::vector<ModelInfo>>(*connection_, options_.timeout, "list models",
      [](Builder& b, uint64_t id) {
        auto body = proto::CreateListModels(b);
        proto::Finish(b,
            proto::CreateClientRequest(b, id, proto::ClientRequestBody::ListModels, body.Union()));
      },
      ControllerReplyBody::ModelList,
      [](const ControllerReply* reply) -> absl::StatusOr<std::vector<ModelInfo>> {
        std::vector<ModelInfo> models;
        auto* list = reply->body_as_ModelList()->models();
        if (list == nullptr) return models;
        for (const proto::ModelInfo* m : *list) {
          models.push_back(ModelInfo{m->name() ? m->name()->str() : "",
                                     m->zoo_model() ? m->zoo_model()->str() : "",
                                     m->param_bytes()});
        }
        return models;
      });
}

namespace {

// Submission replies come twice: TaskAccepted at once, TaskResult (or Error) at the end.
ReplyHandler SubmitHandler(std::shared_ptr<std::promise<absl::StatusOr<TaskResult>>> promise) {
  return [promise](const absl::StatusOr<const ControllerReply*>& reply) {
    if (!reply.ok()) {
      promise->set_value(reply.status());
      return true;
    }
    switch ((*reply)->body_type()) {
      case ControllerReplyBody::TaskAccepted:
        return false;
      case ControllerReplyBody::TaskResult: {
        auto* wire = (*reply)->body_as_TaskResult();
        auto outputs = proto::FromWireTensors(wire->outputs());
        if (!outputs.ok()) {
          promise->set_value(outputs.status());
        } else {
          promise->set_value(ToResult(*wire, std::move(*outputs)));
        }
        return true;
      }
      case ControllerReplyBody::Error:
        promise->set_value(ReplyError(*reply));
        return true;
      default:
        promise->set_value(absl::InternalError("unexpected reply to a task submission"));
        return true;
    }
  };
}

}  // namespace

std::future<absl::StatusOr<TaskResult>> Client::InferAsync(const std::string& model,
                                                           std::vector<proto::HostTensor> inputs,
                                                           const InferOptions& options) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<TaskResult>>>();
  auto future = promise->get_future();
  for (const proto::HostTensor& t : inputs) {
    absl::Status valid = proto::ValidateHostTensor(t);
    if (!valid.ok()) {
      promise->set_value(valid);
      return future;
    }
  }
  connection_->Call(
      [&](Builder& b, uint64_t id) {
        auto wire_inputs = proto::CreateWireTensors(b, inputs);
        auto body = proto::CreateSubmitTask(
            b, b.CreateString(model), proto::TaskKind::Inference, wire_inputs, 1, 0,
            options.priority, static_cast<uint64_t>(absl::ToInt64Milliseconds(options.deadline)));
        proto::Finish(b,
            proto::CreateClientRequest(b, id, proto::ClientRequestBody::SubmitTask, body.Union()));
      },
      SubmitHandler(promise));
  return future;
}

std::future<absl::StatusOr<TaskResult>> Client::TrainAsync(const std::string& model,
                                                           const TrainOptions& options) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<TaskResult>>>();
  auto future = promise->get_future();
  connection_->Call(
      [&](Builder& b, uint64_t id) {
        auto body = proto::CreateSubmitTask(
            b, b.CreateString(model), proto::TaskKind::Training, 0, options.iterations,
            options.seed, options.priority,
            static_cast<uint64_t>(absl::ToInt64Milliseconds(options.deadline)),
            options.optimizer == Optimizer::kAdam ? proto::Optimizer::Adam : proto::Optimizer::Sgd,
            options.learning_rate, options.momentum, options.batch,
            options.as_model.empty() ? 0 : b.CreateString(options.as_model));
        proto::Finish(b,
            proto::CreateClientRequest(b, id, proto::ClientRequestBody::SubmitTask, body.Union()));
      },
      SubmitHandler(promise));
  return future;
}

absl::StatusOr<TaskResult> Client::Infer(const std::string& model,
                                         std::vector<proto::HostTensor> inputs,
                                         const InferOptions& options) {
  auto future = InferAsync(model, std::move(inputs), options);
  return Await(future, options_.timeout, "inference");
}

absl::StatusOr<TaskResult> Client::Train(const std::string& model, const TrainOptions& options) {
  auto future = TrainAsync(model, options);
  return Await(future, options_.timeout, "training");
}

absl::StatusOr<TaskStatus> Client::Status(uint64_t task_id) {
  return CallAndAwait<TaskStatus>(*connection_, options_.timeout, "status",
      [task_id](Builder& b, uint64_t id) {
        auto body = proto::CreateQueryTask(b, task_id);
        proto::Finish(b,
            proto::CreateClientRequest(b, id, proto::ClientRequestBody::QueryTask, body.Union()));
      },
      ControllerReplyBody::TaskStatus,
      [](const ControllerReply* reply) -> absl::StatusOr<TaskStatus> {
        return api::Decode(*reply->body_as_TaskStatus());
      });
}

absl::StatusOr<std::vector<TaskStatus>> Client::ListTasks(uint32_t limit) {
  return CallAndAwait<std::vector<TaskStatus>>(*connection_, options_.timeout, "task list",
      [limit](Builder& b, uint64_t id) {
        auto body = proto::CreateListTasks(b, limit);
        proto::Finish(b,
            proto::CreateClientRequest(b, id, proto::ClientRequestBody::ListTasks, body.Union()));
      },
      ControllerReplyBody::TaskList,
      [](const ControllerReply* reply) -> absl::StatusOr<std::vector<TaskStatus>> {
        std::vector<TaskStatus> tasks;
        if (auto* wire = reply->body_as_TaskList()->tasks()) {
          for (const proto::TaskStatus* s : *wire) {
            PSWITCH_ASSIGN_OR_RETURN(TaskStatus status, api::Decode(*s));
            tasks.push_back(std::move(status));
          }
        }
        return tasks;
      });
}

absl::Status Client::AckCall(std::function<void(Builder&, uint64_t)> build, const char* what) {
  return CallAndAwait<bool>(*connection_, options_.timeout, what,
      std::move(build), ControllerReplyBody::Ack,
      [](const ControllerReply*) -> absl::StatusOr<bool> { return true; }).status();
}

absl::Status Client::Cancel(uint64_t task_id) {
  return AckCall(
      [task_id](Builder& b, uint64_t id) {
        auto body = proto::CreateCancelTask(b, task_id);
        proto::Finish(b,
            proto::CreateClientRequest(b, id, proto::ClientRequestBody::CancelTask, body.Union()));
      },
      "cancel");
}

absl::Status Client::Unload(const std::string& name) {
  return AckCall(
      [&name](Builder& b, uint64_t id) {
        auto body = proto::CreateUnloadModel(b, b.CreateString(name));
        proto::Finish(b,
            proto::CreateClientRequest(b, id, proto::ClientRequestBody::UnloadModel, body.Union()));
      },
      "unload");
}

absl::Status Client::SendBubble(const std::function<void(Builder&, uint64_t)>& build) {
  {
    absl::MutexLock lock(&bubble_mu_);
    if (!bubble_error_.ok()) return bubble_error_;
  }
  // The reply's error belongs to the next bubble call, however fast it arrives; only a failure
  // to send at all (the callback runs on this thread, inside Call) is this call's own.
  const std::thread::id caller = std::this_thread::get_id();
  auto send_error = std::make_shared<absl::Status>();
  connection_->Call(build, [this, caller, send_error](
                               const absl::StatusOr<const ControllerReply*>& reply) {
    absl::Status error = !reply.ok()                                           ? reply.status()
                         : (*reply)->body_type() == ControllerReplyBody::Error ? ReplyError(*reply)
                                                                               : absl::OkStatus();
    if (!error.ok()) {
      absl::MutexLock lock(&bubble_mu_);
      if (bubble_error_.ok()) bubble_error_ = error;
      if (std::this_thread::get_id() == caller) *send_error = error;
    }
    return true;
  });
  return *send_error;
}

absl::Status Client::BubbleBegin(uint32_t gpu, absl::Duration expected, uint64_t free_bytes,
                                 int64_t began_ns) {
  if (began_ns == 0) began_ns = base::MonotonicNowNs();
  const uint64_t us =
      static_cast<uint64_t>(std::max<int64_t>(absl::ToInt64Microseconds(expected), 0));
  return SendBubble([=](Builder& b, uint64_t id) {
    auto body = proto::CreateBubbleBegin(b, gpu, us, free_bytes, began_ns);
    proto::Finish(b,
        proto::CreateClientRequest(b, id, proto::ClientRequestBody::BubbleBegin, body.Union()));
  });
}

absl::Status Client::BubbleEnd(uint32_t gpu) {
  return SendBubble([=](Builder& b, uint64_t id) {
    auto body = proto::CreateBubbleEnd(b, gpu);
    proto::Finish(b, proto::CreateClientRequest(b, id, proto::ClientRequestBody::BubbleEnd, body.Union()));
  });
}

absl::Status Client::RegisterBubbleCycle(uint32_t gpu, const std::string& cycle_json,
                                         int64_t origin_ns) {
  if (origin_ns < 0) return absl::InvalidArgumentError("bubble cycle origin_ns must be >= 0");
  return AckCall(
      [&](Builder& b, uint64_t id) {
        auto body = proto::CreateRegisterBubbleCycle(b, gpu, b.CreateString(cycle_json),
                                                     static_cast<uint64_t>(origin_ns));
        proto::Finish(b, proto::CreateClientRequest(b, id, proto::ClientRequestBody::RegisterBubbleCycle,
                                            body.Union()));
      },
      "register bubble cycle");
}

namespace {

absl::StatusOr<FillJobStatus> ParseFillStatus(const ControllerReply* reply) {
  return api::Decode(*reply->body_as_FillStatus());
}

int64_t Us(absl::Duration d) { return std::max<int64_t>(absl::ToInt64Microseconds(d), 0); }

flatbuffers::Offset<proto::FillSubmit> CreateFillSubmit(Builder& b, const FillJobOptions& o) {
  return proto::CreateFillSubmit(
      b, api::ToWire(o.kind), b.CreateString(o.model), b.CreateString(o.dataset_path),
      b.CreateString(o.output_path), o.batch, o.steps, o.seed, Us(o.step), o.memory_bytes,
      static_cast<uint64_t>(absl::ToInt64Milliseconds(o.deadline)), Us(o.synthetic_step),
      o.synthetic_alloc_bytes, o.ignore_pause);
}

}  // namespace

absl::StatusOr<FillJobStatus> Client::SubmitFill(const FillJobOptions& o) {
  return CallAndAwait<FillJobStatus>(*connection_, options_.timeout, "fill submit",
      [&](Builder& b, uint64_t id) {
        auto body = CreateFillSubmit(b, o);
        proto::Finish(b,
            proto::CreateClientRequest(b, id, proto::ClientRequestBody::FillSubmit, body.Union()));
      },
      ControllerReplyBody::FillStatus, ParseFillStatus);
}

absl::StatusOr<FillJobStatus> Client::EstimateFill(const FillJobOptions& o) {
  return CallAndAwait<FillJobStatus>(*connection_, options_.timeout, "fill estimate",
      [&](Builder& b, uint64_t id) {
        auto job = CreateFillSubmit(b, o);
        auto body = proto::CreateFillEstimateQuery(b, job);
        proto::Finish(b, proto::CreateClientRequest(b, id, proto::ClientRequestBody::FillEstimateQuery,
                                            body.Union()));
      },
      ControllerReplyBody::FillStatus, ParseFillStatus);
}

absl::Status Client::CancelFill(uint64_t job_id) {
  return AckCall(
      [job_id](Builder& b, uint64_t id) {
        auto body = proto::CreateFillCancel(b, job_id);
        proto::Finish(b,
            proto::CreateClientRequest(b, id, proto::ClientRequestBody::FillCancel, body.Union()));
      },
      "fill cancel");
}

absl::StatusOr<FillJobStatus> Client::FillStatus(uint64_t job_id) {
  return CallAndAwait<FillJobStatus>(*connection_, options_.timeout, "fill status",
      [&](Builder& b, uint64_t id) {
        auto body = proto::CreateFillQuery(b, job_id);
        proto::Finish(b,
            proto::CreateClientRequest(b, id, proto::ClientRequestBody::FillQuery, body.Union()));
      },
      ControllerReplyBody::FillStatus, ParseFillStatus);
}

absl::StatusOr<FillServerStats> Client::FillStats() {
  return CallAndAwait<FillServerStats>(*connection_, options_.timeout, "fill stats",
      [&](Builder& b, uint64_t id) {
        auto body = proto::CreateFillStatsQuery(b);
        proto::Finish(b, proto::CreateClientRequest(b, id, proto::ClientRequestBody::FillStatsQuery,
                                            body.Union()));
      },
      ControllerReplyBody::FillStats,
      [](const ControllerReply* reply) -> absl::StatusOr<FillServerStats> {
        return api::Decode(*reply->body_as_FillStats());
      });
}

}  // namespace pswitch::client
