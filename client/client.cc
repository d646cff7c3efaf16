#include "client/client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <functional>
#include <span>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "api/client_codec.h"
#include "base/clock.h"
#include "base/status.h"
#include "client/local_address.h"
#include "client/passed_files.h"
#include "proto/client_generated.h"
#include "proto/frame_channel.h"
#include "proto/framing.h"
#include "proto/wire_status.h"

namespace pswitch::client {
namespace {

using proto::ControllerReply;
using proto::ControllerReplyBody;

// SubmitTask.online_slo_us of `options` (0: a plain request; a positive objective never rounds
// to 0).
uint64_t OnlineSloUs(const InferOptions& options) {
  if (options.online_slo <= absl::ZeroDuration()) return 0;
  return static_cast<uint64_t>(std::max<int64_t>(1, absl::ToInt64Microseconds(options.online_slo)));
}
using Builder = flatbuffers::FlatBufferBuilder;
// Gets every reply for one request; returns true when it was the last one.
using ReplyHandler = std::function<bool(const absl::StatusOr<const ControllerReply*>&)>;

absl::Status ReplyError(const ControllerReply* reply) {
  return proto::FromWireError(reply->body_as_Error());
}

// The fields TaskResult and AreaResult share.
template <typename Result>
void FillTimes(const proto::TaskResult& wire, Result& result) {
  result.task_id = wire.task_id();
  result.latency = absl::Microseconds(wire.latency_us());
  result.switch_time = absl::Microseconds(wire.switch_us());
  result.breakdown.stop_sent = absl::Microseconds(wire.stop_sent_us());
  result.breakdown.drained = absl::Microseconds(wire.drained_us());
  result.breakdown.first_group = absl::Microseconds(wire.first_group_us());
  result.breakdown.first_layer_start = absl::Microseconds(wire.first_layer_start_us());
  result.breakdown.first_layer_done = absl::Microseconds(wire.first_layer_done_us());
  result.breakdown.last_group = absl::Microseconds(wire.last_group_us());
  result.breakdown.old_stopped = absl::Microseconds(wire.old_stopped_us());
}

TaskResult ToResult(const proto::TaskResult& wire, std::vector<proto::HostTensor> outputs) {
  TaskResult result;
  FillTimes(wire, result);
  result.outputs = std::move(outputs);
  return result;
}

}  // namespace

// The socket, a reader thread, and the table of requests awaiting replies.
class Client::Connection {
 public:
  // Replies may be followed by at most `max_payload_bytes` raw bytes (4 x the frame bound, as
  // pswitchd's requests).
  Connection(std::unique_ptr<proto::FrameChannel> channel, uint64_t max_payload_bytes)
      : channel_(std::move(channel)),
        max_payload_bytes_(max_payload_bytes),
        reader_([this] { ReadLoop(); }) {}

  ~Connection() {
    ::shutdown(channel_->fd(), SHUT_RDWR);  // unblocks the reader
    reader_.join();
  }

  // Sends the request `build` makes (given its id), with `fds` passed (Unix socket), followed by
  // the bytes of `raw` (its ClientRequest.payload_bytes) in the same scatter-gather write;
  // `handler` gets every reply to it. `raw` is only read during the call.
  void Call(const std::function<void(Builder&, uint64_t)>& build, ReplyHandler handler,
            const std::vector<int>& fds = {},
            const std::vector<std::span<const uint8_t>>& raw = {}) {
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
      if (!raw.empty()) {
        sent = SendWithRaw(b, raw);
      } else if (fds.empty()) {
        sent = channel_->Send(b);
      } else {
        absl::StatusOr<std::vector<uint8_t>> frame = proto::EncodeFrame(b);
        sent = frame.ok() ? SendFrameWithFds(channel_->fd(), *frame, fds) : frame.status();
      }
    }
    if (!sent.ok()) Complete(id, sent);
  }

  // For a handler, while it runs (on the reader thread): the outputs of the reply it is handling
  // when that reply carried a raw payload, each received straight into its own buffer (inline).
  std::vector<proto::HostTensor> TakePayloadOutputs() { return std::move(payload_outputs_); }

  void Forget(uint64_t id) {
    absl::MutexLock lock(&mu_);
    pending_.erase(id);
  }

  // `on_closed` runs once when the connection is lost (at once if it already is).
  void OnClosed(std::function<void(const absl::Status&)> on_closed) {
    absl::Status why;
    {
      absl::MutexLock lock(&mu_);
      if (closed_.ok()) {
        on_closed_ = std::move(on_closed);
        return;
      }
      why = closed_;
    }
    on_closed(why);
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
      if ((*reply)->payload_bytes() > 0) {
        // Read before the next frame: the raw bytes follow this reply on the stream.
        if (absl::Status raw = ReceivePayload(**reply); !raw.ok()) {
          why = raw;
          break;
        }
      }
      Complete((*reply)->request_id(), *reply);
      payload_outputs_.clear();
    }
    absl::flat_hash_map<uint64_t, ReplyHandler> orphans;
    std::function<void(const absl::Status&)> on_closed;
    {
      absl::MutexLock lock(&mu_);
      closed_ = why;
      orphans.swap(pending_);
      on_closed.swap(on_closed_);
    }
    if (on_closed) on_closed(why);
    for (auto& [id, handler] : orphans) handler(why);
  }

  // The frame in `b`, then `raw`, with as few sendmsg calls as the socket allows (no copy).
  absl::Status SendWithRaw(const Builder& b, const std::vector<std::span<const uint8_t>>& raw) {
    PSWITCH_ASSIGN_OR_RETURN(auto header, proto::EncodeFrameHeader(b.GetSize()));
    std::vector<iovec> iov;
    iov.reserve(raw.size() + 2);
    iov.push_back({header.data(), header.size()});
    iov.push_back({b.GetBufferPointer(), b.GetSize()});
    for (std::span<const uint8_t> part : raw) {
      if (!part.empty()) iov.push_back({const_cast<uint8_t*>(part.data()), part.size()});
    }
    size_t first = 0;
    while (first < iov.size()) {
      msghdr msg{};
      msg.msg_iov = iov.data() + first;
      msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
      const ssize_t n = ::sendmsg(channel_->fd(), &msg, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          pollfd p{channel_->fd(), POLLOUT, 0};
          (void)::poll(&p, 1, -1);
          continue;
        }
        return ErrnoStatus("sending a request's raw payload");
      }
      // Drop what was sent from the front of the iovec list.
      size_t left = static_cast<size_t>(n);
      while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
      if (left > 0) {
        iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
      }
    }
    return absl::OkStatus();
  }

  // Reads exactly `n` bytes into `into` (null: dropped) from the socket, which holds nothing
  // buffered past the reply (FrameChannel never reads beyond a frame's end).
  absl::Status ReadRaw(uint8_t* into, size_t n) {
    uint8_t scratch[64 << 10];
    while (n > 0) {
      uint8_t* dest = into != nullptr ? into : scratch;
      const size_t want = into != nullptr ? n : std::min(n, sizeof(scratch));
      const ssize_t r = ::recv(channel_->fd(), dest, want, 0);
      if (r == 0) return absl::UnavailableError("pswitchd closed mid-payload");
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          pollfd p{channel_->fd(), POLLIN, 0};
          (void)::poll(&p, 1, -1);
          continue;
        }
        return ErrnoStatus("receiving a reply's raw payload");
      }
      n -= static_cast<size_t>(r);
      if (into != nullptr) into += r;
    }
    return absl::OkStatus();
  }

  // A TaskResult's raw payload, each Payload output received straight into its own buffer; the
  // outputs wait in payload_outputs_ for the reply's handler. Errors lose the stream.
  absl::Status ReceivePayload(const ControllerReply& reply) {
    const uint64_t bytes = reply.payload_bytes();
    if (bytes > max_payload_bytes_ || reply.body_type() != ControllerReplyBody::TaskResult) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pswitchd sent a raw payload of ", bytes, " bytes after a reply that cannot carry it"));
    }
    PSWITCH_ASSIGN_OR_RETURN(std::vector<proto::HostTensor> outputs,
                             proto::FromWireTensors(reply.body_as_TaskResult()->outputs()));
    std::vector<proto::HostTensor*> order;
    for (proto::HostTensor& t : outputs) {
      if (t.place != proto::Place::Payload) continue;
      if (t.slice.offset > bytes || t.slice.length > bytes - t.slice.offset) {
        return absl::InvalidArgumentError(
            absl::StrCat("output '", t.name, "' lies outside the reply's raw payload"));
      }
      order.push_back(&t);
    }
    std::sort(order.begin(), order.end(), [](const proto::HostTensor* a,
                                             const proto::HostTensor* b) {
      return a->slice.offset < b->slice.offset;
    });
    uint64_t at = 0;
    for (proto::HostTensor* t : order) {
      if (t->slice.offset < at) {
        return absl::InvalidArgumentError("outputs overlap in the reply's raw payload");
      }
      PSWITCH_RETURN_IF_ERROR(ReadRaw(nullptr, t->slice.offset - at));  // alignment padding
      t->data.resize(t->slice.length);
      PSWITCH_RETURN_IF_ERROR(ReadRaw(t->data.data(), t->data.size()));
      at = t->slice.offset + t->slice.length;
      t->place = proto::Place::Inline;
      t->slice = proto::ByteSlice{};
    }
    PSWITCH_RETURN_IF_ERROR(ReadRaw(nullptr, bytes - at));
    payload_outputs_ = std::move(outputs);
    return absl::OkStatus();
  }

  std::unique_ptr<proto::FrameChannel> channel_;
  const uint64_t max_payload_bytes_;
  std::vector<proto::HostTensor> payload_outputs_;  // reader thread only
  absl::Mutex send_mu_;
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, ReplyHandler> pending_ ABSL_GUARDED_BY(mu_);
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
  std::function<void(const absl::Status&)> on_closed_ ABSL_GUARDED_BY(mu_);
  std::thread reader_;  // last: starts once the members it uses exist
};


Client::Client(std::unique_ptr<Connection> connection, const ClientOptions& options, bool local)
    : options_(options) {
  if (local) {
    areas_ = AreaAllocator::Create(options.areas,
                                   [this](const TransferArea& area) { return RegisterArea(area); });
  }
  connection_ = std::move(connection);
  if (areas_ != nullptr) {
    // The areas die with the connection on pswitchd's side: later allocations would name ids
    // it no longer knows. Spans already out stay mapped here.
    std::weak_ptr<AreaAllocator> areas = areas_;
    connection_->OnClosed([areas](const absl::Status& why) {
      if (auto a = areas.lock()) a->Close(why);
    });
  }
}

Client::~Client() {
  if (areas_ != nullptr) areas_->Close(absl::FailedPreconditionError("the client is closed"));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(absl::string_view address,
                                                        const ClientOptions& options) {
  PSWITCH_ASSIGN_OR_RETURN(
      DialedChannel dialed,
      DialPswitchd(address, options.transport, options.max_frame_bytes));
  const bool local = dialed.local;
  std::unique_ptr<Client> client(
      new Client(std::make_unique<Connection>(std::move(dialed.channel),
                                              uint64_t{4} * options.max_frame_bytes),
                 options, local));
  if (!options.token.empty()) PSWITCH_RETURN_IF_ERROR(client->Authenticate(options.token));
  if (local) {
    absl::Status reserved = client->areas_->Reserve(options.areas.first_area_bytes);
    // pswitchd's per-principal bound on areas: the client still works, with HostTensor calls
    // sent in the frame (Infer's fallback); a caller asking for area tensors gets the error.
    if (!reserved.ok() && !absl::IsResourceExhausted(reserved)) return reserved;
  }
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

// Takes a reply that comes before a call's final one (on the reader thread); false: not one.
using InterimReply = std::function<bool(const ControllerReply*)>;

// A one-reply call whose reply body must be `expected`; `parse` turns it into T. Waits up to
// `timeout` for the reply. Replies `interim` takes come before it and do not end the call.
template <typename T, typename Connection>
absl::StatusOr<T> CallAndAwait(Connection& connection, absl::Duration timeout,
                               absl::string_view what,
                               const std::function<void(Builder&, uint64_t)>& build,
                               ControllerReplyBody expected,
                               std::function<absl::StatusOr<T>(const ControllerReply*)> parse,
                               const std::vector<int>& fds = {}, InterimReply interim = nullptr) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<T>>>();
  auto future = promise->get_future();
  connection.Call(
      build,
      [promise, expected, parse = std::move(parse),
       interim = std::move(interim)](const absl::StatusOr<const ControllerReply*>& reply) {
        if (!reply.ok()) {
          promise->set_value(reply.status());
        } else if (interim && interim(*reply)) {
          return false;
        } else if ((*reply)->body_type() == ControllerReplyBody::Error) {
          promise->set_value(ReplyError(*reply));
        } else if ((*reply)->body_type() != expected) {
          promise->set_value(absl::InternalError(absl::StrCat(
              "unexpected reply ", proto::EnumNameControllerReplyBody((*reply)->body_type()))));
        } else {
          promise->set_value(parse(*reply));
        }
        return true;
      },
      fds);
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

namespace {

// Every int64 of a verified [long] vector, read bytewise (the verifier does not check its
// alignment; proto/host_tensor.cc reads shapes the same way).
std::vector<int64_t> ReadLongs(const flatbuffers::Vector<int64_t>* wire) {
  std::vector<int64_t> out;
  if (wire == nullptr) return out;
  out.resize(wire->size());
  for (flatbuffers::uoffset_t i = 0; i < wire->size(); ++i) {
    int64_t value;
    std::memcpy(&value, wire->Data() + i * sizeof(int64_t), sizeof(value));
    out[i] = flatbuffers::EndianScalar(value);
  }
  return out;
}

}  // namespace

absl::StatusOr<RegisteredModel> Client::Register(const RegisterOptions& options) {
  PassedFiles files;
  if (local()) {
    PSWITCH_RETURN_IF_ERROR(files.Read(options.weights_path, proto::FileRole::Weights));
    PSWITCH_RETURN_IF_ERROR(files.Read(options.archive_path, proto::FileRole::Archive));
    if (options.plan != "auto") {
      PSWITCH_RETURN_IF_ERROR(files.Read(options.plan, proto::FileRole::Plan));
    }
  }
  // The progress callback may capture the caller's stack: it is never called once Register has
  // returned, even when it returns at the timeout with the registration still under way (a call
  // in progress finishes first).
  struct PhaseSink {
    absl::Mutex mu;
    std::function<void(const std::string&, absl::Duration)> fn ABSL_GUARDED_BY(mu);
    std::function<void(const std::string&, absl::Duration, const std::string&)> detail
        ABSL_GUARDED_BY(mu);
  };
  auto sink = std::make_shared<PhaseSink>();
  {
    absl::MutexLock lock(&sink->mu);
    sink->fn = options.on_phase;
    sink->detail = options.on_phase_progress;
  }
  absl::StatusOr<RegisteredModel> registered = CallAndAwait<RegisteredModel>(
      *connection_, options_.timeout, "register",
      [&](Builder& b, uint64_t id) {
        auto body = proto::CreateRegisterModel(
            b, b.CreateString(options.name), b.CreateString(options.zoo_model),
            b.CreateString(options.weights_path), options.batch_size,
            b.CreateString(options.plan.empty() ? "auto" : options.plan),
            b.CreateString(options.archive_path),
            options.trainers.empty() ? 0 : b.CreateVectorOfStrings(options.trainers),
            options.on_phase != nullptr || options.on_phase_progress != nullptr,
            options.dtype.empty() ? 0 : b.CreateString(options.dtype),
            options.on_phase_progress != nullptr, options.pin_resident);
        auto roles = files.Roles(b);
        proto::Finish(b, proto::CreateClientRequest(b, id, proto::ClientRequestBody::RegisterModel,
                                                    body.Union(), 0, roles));
      },
      ControllerReplyBody::Registered,
      [](const ControllerReply* reply) -> absl::StatusOr<RegisteredModel> {
        auto* r = reply->body_as_Registered();
        RegisteredModel model{
            r->name() ? r->name()->str() : "", r->layers(), r->groups(), r->param_bytes(), {}};
        if (r->phases() != nullptr) {
          for (const proto::RegistrationPhase* p : *r->phases()) {
            model.phases.emplace_back(p->name() ? p->name()->str() : "",
                                      absl::Microseconds(p->us()));
          }
        }
        return model;
      },
      files.fds(),
      [sink](const ControllerReply* reply) {
        if (reply->body_type() != ControllerReplyBody::RegistrationProgress) return false;
        const proto::RegistrationProgress* progress = reply->body_as_RegistrationProgress();
        const proto::RegistrationPhase* p = progress->phase();
        if (p == nullptr) return true;
        const std::string name = p->name() ? p->name()->str() : "";
        absl::MutexLock lock(&sink->mu);
        if (progress->detail() != nullptr && progress->detail()->size() > 0) {
          if (sink->detail != nullptr) {
            sink->detail(name, absl::Microseconds(p->us()), progress->detail()->str());
          }
        } else if (sink->fn != nullptr) {
          sink->fn(name, absl::Microseconds(p->us()));
        }
        return true;
      });
  absl::MutexLock lock(&sink->mu);
  sink->fn = nullptr;
  sink->detail = nullptr;
  return registered;
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
          ModelInfo info{m->name() ? m->name()->str() : "",
                         m->zoo_model() ? m->zoo_model()->str() : "",
                         m->param_bytes(),
                         m->output_dtype(),
                         ReadLongs(m->output_shape()),
                         {}};
          if (const auto* gpus = m->resident_gpus(); gpus != nullptr) {
            info.resident_gpus.assign(gpus->begin(), gpus->end());
          }
          models.push_back(std::move(info));
        }
        return models;
      });
}

absl::StatusOr<uint64_t> Client::RegisterArea(const TransferArea& area) {
  const uint64_t bytes = area.bytes();
  return CallAndAwait<uint64_t>(
      *connection_, options_.timeout, "register transfer area",
      [bytes](Builder& b, uint64_t id) {
        auto body = proto::CreateRegisterArea(b, bytes);
        proto::Finish(b, proto::CreateClientRequest(b, id, proto::ClientRequestBody::RegisterArea,
                                                    body.Union()));
      },
      ControllerReplyBody::AreaRegistered,
      [bytes](const ControllerReply* reply) -> absl::StatusOr<uint64_t> {
        auto* r = reply->body_as_AreaRegistered();
        if (r->area() == 0 || r->bytes() != bytes) {
          return absl::InternalError(absl::StrCat("pswitchd registered area ", r->area(), " of ",
                                                  r->bytes(), " bytes for one of ", bytes));
        }
        return r->area();
      },
      {area.fd()});
}

absl::StatusOr<Client::OutputSpec> Client::OutputSpecOf(const std::string& model) {
  {
    absl::MutexLock lock(&specs_mu_);
    auto it = output_specs_.find(model);
    if (it != output_specs_.end()) return it->second;
  }
  PSWITCH_ASSIGN_OR_RETURN(std::vector<ModelInfo> models, ListModels());
  OutputSpec spec;  // unknown unless listed: the task's own answer names the model's problem
  for (const ModelInfo& m : models) {
    if (m.name == model) spec = OutputSpec{m.output_dtype, m.output_shape};
  }
  if (!spec.shape.empty()) {
    absl::MutexLock lock(&specs_mu_);
    output_specs_[model] = spec;
  }
  return spec;
}

void Client::ForgetOutputSpec(const std::string& model) {
  absl::MutexLock lock(&specs_mu_);
  output_specs_.erase(model);
}

namespace {

// Submission replies come twice: TaskAccepted at once, TaskResult (or Error) at the end.
// Hands over (on the reader thread, while the handler runs) the outputs that came as a raw
// payload after the reply.
using PayloadOutputs = std::function<std::vector<proto::HostTensor>()>;

ReplyHandler SubmitHandler(std::shared_ptr<std::promise<absl::StatusOr<TaskResult>>> promise,
                           PayloadOutputs payload_outputs) {
  return [promise, payload_outputs](const absl::StatusOr<const ControllerReply*>& reply) {
    if (!reply.ok()) {
      promise->set_value(reply.status());
      return true;
    }
    switch ((*reply)->body_type()) {
      case ControllerReplyBody::TaskAccepted:
        return false;
      case ControllerReplyBody::TaskResult: {
        auto* wire = (*reply)->body_as_TaskResult();
        absl::StatusOr<std::vector<proto::HostTensor>> outputs =
            (*reply)->payload_bytes() > 0 ? payload_outputs()
                                          : proto::FromWireTensors(wire->outputs());
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

namespace {

// The bytes a task's outputs need under `spec` (-1 = the first input's batch), rounded to the
// area's alignment; 0 when the spec is unknown.
absl::StatusOr<uint64_t> OutputBytes(proto::DType dtype, std::vector<int64_t> shape,
                                     const std::vector<AreaTensor>& inputs) {
  if (shape.empty()) return 0;
  const int64_t batch = inputs.empty() || inputs[0].shape().empty() ? 1 : inputs[0].shape()[0];
  for (int64_t& dim : shape) {
    if (dim == -1) dim = batch;
  }
  absl::StatusOr<uint64_t> bytes = proto::ShapeBytes(dtype, shape);
  if (!bytes.ok()) {
    return absl::InternalError(
        absl::StrCat("pswitchd's output spec is unusable: ", bytes.status().message()));
  }
  if (*bytes > UINT64_MAX - kAreaAlignment) return absl::InternalError("output spec overflows");
  return (*bytes + kAreaAlignment - 1) / kAreaAlignment * kAreaAlignment;
}

// What one area inference holds until pswitchd's final answer: its inputs' and outputs' spans
// (a worker may read or write them until then, timeout or not) and whom to tell.
struct AreaCall {
  std::vector<AreaTensor> inputs;
  std::shared_ptr<AreaSpan> outputs;  // null: outputs come inline (the spec was unknown)
  std::vector<proto::HostTensor> sent;
  std::function<void(absl::StatusOr<AreaResult>)> done;
};

// The result's outputs as views of the span the request gave them. pswitchd is checked like
// any peer: an output outside that span is refused, never read.
absl::StatusOr<AreaResult> ToAreaResult(const proto::TaskResult& wire, const AreaCall& call,
                                        AreaAllocator& areas) {
  AreaResult result;
  FillTimes(wire, result);
  result.sent_inputs = call.sent;
  PSWITCH_ASSIGN_OR_RETURN(std::vector<proto::HostTensor> outputs,
                           proto::FromWireTensors(wire.outputs()));
  for (proto::HostTensor& t : outputs) {
    if (t.place == proto::Place::Region) {
      const AreaSpan* space = call.outputs.get();
      if (space == nullptr || t.slice.region != space->area_id() ||
          t.slice.offset < space->offset() || t.slice.offset - space->offset() > space->length() ||
          t.slice.length > space->length() - (t.slice.offset - space->offset())) {
        return absl::InternalError(absl::StrCat(
            "pswitchd placed output '", t.name, "' at area ", t.slice.region, " offset ",
            t.slice.offset, " (", t.slice.length, " bytes), outside the space the request gave"));
      }
      result.outputs.emplace_back(t.name, t.dtype, std::move(t.shape), call.outputs,
                                  t.slice.offset - space->offset(), t.slice.length);
    } else if (t.place == proto::Place::Inline) {
      // Only when the spec was unknown. This runs on the reader thread, which must not wait for
      // a reply (registering an area would): existing room only.
      PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<AreaSpan> span,
                               areas.Allocate(t.data.size(), /*may_grow=*/false));
      std::memcpy(span->data(), t.data.data(), t.data.size());
      const uint64_t length = t.data.size();
      result.outputs.emplace_back(t.name, t.dtype, std::move(t.shape), std::move(span), 0, length);
    } else {
      return absl::InternalError(
          absl::StrCat("pswitchd sent output '", t.name, "' as a payload to a Unix client"));
    }
  }
  return result;
}

}  // namespace

absl::StatusOr<AreaTensor> Client::Tensor(std::vector<int64_t> shape, proto::DType dtype,
                                          std::string name) {
  if (!local()) {
    return absl::FailedPreconditionError(
        "area tensors need a Unix-socket connection to pswitchd (this client uses TCP)");
  }
  absl::StatusOr<uint64_t> bytes = proto::ShapeBytes(dtype, shape);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", bytes.status().message()));
  }
  PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<AreaSpan> span, areas_->Allocate(*bytes));
  return AreaTensor(std::move(name), dtype, std::move(shape), std::move(span), 0, *bytes);
}

absl::StatusOr<AreaTensor> Client::CopyToArea(const proto::HostTensor& tensor) {
  PSWITCH_RETURN_IF_ERROR(proto::ValidateHostTensor(tensor));
  if (tensor.place != proto::Place::Inline) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.name, "' has no bytes here to copy (it names a slice)"));
  }
  PSWITCH_ASSIGN_OR_RETURN(AreaTensor placed, Tensor(tensor.shape, tensor.dtype, tensor.name));
  std::memcpy(placed.data(), tensor.data.data(), tensor.data.size());
  return placed;
}

absl::StatusOr<std::shared_ptr<AreaSpan>> Client::AllocateOutputs(
    const std::string& model, const std::vector<AreaTensor>& inputs) {
  PSWITCH_ASSIGN_OR_RETURN(OutputSpec spec, OutputSpecOf(model));
  PSWITCH_ASSIGN_OR_RETURN(uint64_t bytes, OutputBytes(spec.dtype, spec.shape, inputs));
  if (bytes == 0) return std::shared_ptr<AreaSpan>();
  return areas_->Allocate(bytes);
}

void Client::SubmitArea(const std::string& model, std::vector<AreaTensor> inputs,
                        const InferOptions& options,
                        std::function<void(absl::StatusOr<AreaResult>)> done) {
  if (!local()) {
    done(absl::FailedPreconditionError("area inference needs a Unix-socket connection"));
    return;
  }
  absl::StatusOr<std::shared_ptr<AreaSpan>> outputs = AllocateOutputs(model, inputs);
  if (!outputs.ok()) {
    done(outputs.status());
    return;
  }
  SendArea(model, std::move(inputs), *std::move(outputs), options, std::move(done));
}

void Client::SendArea(const std::string& model, std::vector<AreaTensor> inputs,
                      std::shared_ptr<AreaSpan> outputs, const InferOptions& options,
                      std::function<void(absl::StatusOr<AreaResult>)> done) {
  auto call = std::make_shared<AreaCall>();
  for (const AreaTensor& t : inputs) {
    if (!t.valid()) {
      done(absl::InvalidArgumentError(absl::StrCat("input '", t.name(), "' has no area span")));
      return;
    }
    call->sent.push_back(t.Descriptor());
  }
  call->outputs = std::move(outputs);
  call->inputs = std::move(inputs);
  call->done = std::move(done);
  std::shared_ptr<AreaAllocator> areas = areas_;
  connection_->Call(
      [&](Builder& b, uint64_t id) {
        auto wire_inputs = proto::CreateWireTensors(b, call->sent);
        auto model_name = b.CreateString(model);
        proto::Slice outputs_to;
        if (call->outputs != nullptr) {
          const proto::ByteSlice slice = call->outputs->Slice(0, call->outputs->length());
          outputs_to = proto::Slice(slice.region, slice.offset, slice.length);
        }
        auto body = proto::CreateSubmitTask(
            b, model_name, proto::TaskKind::Inference, wire_inputs, 1, 0, options.priority,
            static_cast<uint64_t>(absl::ToInt64Milliseconds(options.deadline)),
            proto::Optimizer::Sgd, 0.01, 0.9, 0, 0,
            call->outputs != nullptr ? proto::Place::Region : proto::Place::Inline,
            call->outputs != nullptr ? &outputs_to : nullptr, OnlineSloUs(options));
        proto::Finish(b, proto::CreateClientRequest(b, id, proto::ClientRequestBody::SubmitTask,
                                                    body.Union()));
      },
      [this, call, areas, model](const absl::StatusOr<const ControllerReply*>& reply) {
        // The task is over (or its connection is, and with it every later allocation): the spans
        // it held go back before the caller hears, so what the caller then sees is settled.
        auto finish = [&call](absl::StatusOr<AreaResult> result) {
          call->inputs.clear();
          call->outputs.reset();
          call->done(std::move(result));
        };
        if (!reply.ok()) {
          finish(reply.status());
          return true;
        }
        switch ((*reply)->body_type()) {
          case ControllerReplyBody::TaskAccepted:
            return false;
          case ControllerReplyBody::TaskResult:
            finish(ToAreaResult(*(*reply)->body_as_TaskResult(), *call, *areas));
            return true;
          case ControllerReplyBody::Error: {
            absl::Status error = ReplyError(*reply);
            // Too small an output space: the model may have been registered anew under its name.
            if (absl::IsResourceExhausted(error)) ForgetOutputSpec(model);
            finish(error);
            return true;
          }
          default:
            finish(absl::InternalError("unexpected reply to a task submission"));
            return true;
        }
      });
}

std::future<absl::StatusOr<AreaResult>> Client::InferAreaAsync(const std::string& model,
                                                               std::vector<AreaTensor> inputs,
                                                               const InferOptions& options) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<AreaResult>>>();
  auto future = promise->get_future();
  SubmitArea(model, std::move(inputs), options,
             [promise](absl::StatusOr<AreaResult> r) { promise->set_value(std::move(r)); });
  return future;
}

absl::StatusOr<AreaResult> Client::InferArea(const std::string& model,
                                             std::vector<AreaTensor> inputs,
                                             const InferOptions& options) {
  auto future = InferAreaAsync(model, std::move(inputs), options);
  return Await(future, options_.timeout, "inference");
}

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
  if (local()) {
    // One copy in, one out. Full areas (this client's bound or pswitchd's) send the frame.
    std::vector<AreaTensor> placed;
    absl::Status status;
    for (const proto::HostTensor& t : inputs) {
      absl::StatusOr<AreaTensor> p = CopyToArea(t);
      if (!p.ok()) {
        status = p.status();
        break;
      }
      placed.push_back(std::move(*p));
    }
    absl::StatusOr<std::shared_ptr<AreaSpan>> outputs;
    if (status.ok()) {
      outputs = AllocateOutputs(model, placed);
      status = outputs.status();
    }
    if (status.ok()) {
      SendArea(model, std::move(placed), *std::move(outputs), options,
               [promise](absl::StatusOr<AreaResult> r) {
        if (!r.ok()) {
          promise->set_value(r.status());
          return;
        }
        std::vector<proto::HostTensor> outputs;
        for (const AreaTensor& t : r->outputs) outputs.push_back(t.ToHost());
        r->outputs.clear();  // copied out: the space goes back before the caller hears
        TaskResult result;
        result.task_id = r->task_id;
        result.outputs = std::move(outputs);
        result.latency = r->latency;
        result.switch_time = r->switch_time;
        result.breakdown = r->breakdown;
        promise->set_value(std::move(result));
      });
      return future;
    }
    if (!absl::IsResourceExhausted(status) && !absl::IsFailedPrecondition(status)) {
      promise->set_value(status);
      return future;
    }
  }
  if (!local() && options_.tcp_framing == TcpFraming::kPayload) {
    // The inputs' bytes follow the frame from the caller's own buffers (one writev, no copy into
    // the builder), each at a 64-byte-aligned offset; the outputs come back the same way.
    static constexpr uint8_t kPad[64] = {};
    std::vector<proto::HostTensor> described;
    std::vector<std::span<const uint8_t>> raw;
    uint64_t at = 0;
    bool all_inline = true;
    for (const proto::HostTensor& t : inputs) {
      all_inline = all_inline && t.place == proto::Place::Inline;
      const uint64_t aligned = (at + 63) / 64 * 64;
      if (aligned > at) raw.push_back(std::span<const uint8_t>(kPad, aligned - at));
      proto::HostTensor d;
      d.name = t.name;
      d.dtype = t.dtype;
      d.shape = t.shape;
      d.place = proto::Place::Payload;
      d.slice = proto::ByteSlice{0, aligned, t.data.size()};
      described.push_back(std::move(d));
      raw.push_back(std::span<const uint8_t>(t.data));
      at = aligned + t.data.size();
    }
    if (all_inline && at > 0) {
      connection_->Call(
          [&](Builder& b, uint64_t id) {
            auto wire_inputs = proto::CreateWireTensors(b, described);
            auto body = proto::CreateSubmitTask(
                b, b.CreateString(model), proto::TaskKind::Inference, wire_inputs, 1, 0,
                options.priority,
                static_cast<uint64_t>(absl::ToInt64Milliseconds(options.deadline)),
                proto::Optimizer::Sgd, 0.01, 0.9, 0, 0, proto::Place::Payload, nullptr,
                OnlineSloUs(options));
            proto::Finish(b, proto::CreateClientRequest(b, id, proto::ClientRequestBody::SubmitTask,
                                                        body.Union(), at));
          },
          SubmitHandler(promise, [c = connection_.get()] { return c->TakePayloadOutputs(); }), {}, raw);
      return future;
    }
  }
  connection_->Call(
      [&](Builder& b, uint64_t id) {
        auto wire_inputs = proto::CreateWireTensors(b, inputs);
        auto body = proto::CreateSubmitTask(
            b, b.CreateString(model), proto::TaskKind::Inference, wire_inputs, 1, 0,
            options.priority, static_cast<uint64_t>(absl::ToInt64Milliseconds(options.deadline)),
            proto::Optimizer::Sgd, 0.01, 0.9, 0, 0, proto::Place::Inline, nullptr,
            OnlineSloUs(options));
        proto::Finish(b,
            proto::CreateClientRequest(b, id, proto::ClientRequestBody::SubmitTask, body.Union()));
      },
      SubmitHandler(promise, [c = connection_.get()] { return c->TakePayloadOutputs(); }));
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
      SubmitHandler(promise, [c = connection_.get()] { return c->TakePayloadOutputs(); }));
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
  PassedFiles files;
  if (local() && options_.pass_fill_files) {
    PSWITCH_RETURN_IF_ERROR(files.Read(o.dataset_path, proto::FileRole::Dataset));
    PSWITCH_RETURN_IF_ERROR(files.Create(o.output_path, proto::FileRole::Output));
  }
  absl::StatusOr<FillJobStatus> status = CallAndAwait<FillJobStatus>(
      *connection_, options_.timeout, "fill submit",
      [&](Builder& b, uint64_t id) {
        auto body = CreateFillSubmit(b, o);
        auto roles = files.Roles(b);
        proto::Finish(b, proto::CreateClientRequest(b, id, proto::ClientRequestBody::FillSubmit,
                                                    body.Union(), 0, roles));
      },
      ControllerReplyBody::FillStatus, ParseFillStatus, files.fds());
  // A refused job writes nothing: the empty file this call created goes. (After a timeout the
  // job may yet run, so its file stays.)
  if (!status.ok() && !absl::IsDeadlineExceeded(status.status())) files.UnlinkCreated();
  return status;
}

absl::StatusOr<FillJobStatus> Client::EstimateFill(const FillJobOptions& o) {
  // The estimate counts the dataset's rows; it writes nothing, so no output file is made.
  PassedFiles files;
  if (local() && options_.pass_fill_files) {
    PSWITCH_RETURN_IF_ERROR(files.Read(o.dataset_path, proto::FileRole::Dataset));
  }
  return CallAndAwait<FillJobStatus>(
      *connection_, options_.timeout, "fill estimate",
      [&](Builder& b, uint64_t id) {
        auto job = CreateFillSubmit(b, o);
        auto body = proto::CreateFillEstimateQuery(b, job);
        auto roles = files.Roles(b);
        proto::Finish(b,
                      proto::CreateClientRequest(b, id, proto::ClientRequestBody::FillEstimateQuery,
                                                 body.Union(), 0, roles));
      },
      ControllerReplyBody::FillStatus, ParseFillStatus, files.fds());
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
