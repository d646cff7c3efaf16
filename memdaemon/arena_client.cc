#include "memdaemon/arena_client.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "memdaemon/arena_layout.h"
#include "proto/framing.h"
#include "proto/memdaemon_generated.h"
#include "proto/wire_status.h"

namespace pswitch::memdaemon {
namespace {

constexpr absl::Duration kReplyTimeout = absl::Seconds(30);

absl::StatusOr<const proto::MemReply*> ParseReply(const proto::ReceivedFrame& frame,
                                                  uint64_t request_id,
                                                  proto::MemReplyBody expected) {
  PSWITCH_ASSIGN_OR_RETURN(const proto::MemReply* reply,
                           proto::VerifyPayload<proto::MemReply>(frame.payload, "memdaemon reply"));
  if (reply->body_type() == proto::MemReplyBody::Error && reply->request_id() == request_id) {
    return proto::FromWireError(reply->body_as_Error());
  }
  if (reply->request_id() != request_id || reply->body_type() != expected) {
    return absl::InternalError(
        absl::StrCat("memdaemon answered request ", reply->request_id(), " with ",
                     proto::EnumNameMemReplyBody(reply->body_type()), "; expected ", request_id));
  }
  return reply;
}

}  // namespace

template <typename Fn>
absl::StatusOr<proto::ReceivedFrame> ArenaClient::Call(Fn build_request) {
  absl::MutexLock lock(&channel_mu_);
  PSWITCH_RETURN_IF_ERROR(broken_);
  flatbuffers::FlatBufferBuilder b;
  build_request(b, next_request_id_);
  PSWITCH_RETURN_IF_ERROR(Broken(channel_->Send(b)));
  ++next_request_id_;
  absl::StatusOr<proto::ReceivedFrame> frame = channel_->Receive(kReplyTimeout);
  if (!frame.ok()) return Broken(frame.status());
  return frame;
}

absl::Status ArenaClient::Broken(absl::Status status) {
  if (!status.ok() && broken_.ok()) {
    // Replies may be left in the socket: every later request would read one of them.
    broken_ = absl::UnavailableError(
        absl::StrCat("the memdaemon connection is out of step since: ", status.message()));
  }
  return status;
}

absl::StatusOr<std::vector<UniqueFd>> ArenaClient::FetchChunks(uint64_t first, uint64_t count) {
  if (count == 0 || count > kMaxChunksPerRequest) {
    return absl::InvalidArgumentError(
        absl::StrCat("ask for 1 to ", kMaxChunksPerRequest, " chunks at a time, not ", count));
  }
  absl::MutexLock lock(&channel_mu_);
  PSWITCH_RETURN_IF_ERROR(broken_);
  const uint64_t id = next_request_id_++;
  flatbuffers::FlatBufferBuilder b;
  auto ask = proto::CreateExportChunks(b, first, static_cast<uint32_t>(count));
  proto::Finish(b,
                proto::CreateMemRequest(b, id, proto::MemRequestBody::ExportChunks, ask.Union()));
  PSWITCH_RETURN_IF_ERROR(Broken(channel_->Send(b)));
  std::vector<UniqueFd> fds;
  fds.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    absl::StatusOr<proto::ReceivedFrame> frame = channel_->Receive(kReplyTimeout);
    if (!frame.ok()) return Broken(frame.status());
    absl::StatusOr<const proto::MemReply*> reply =
        ParseReply(*frame, id, proto::MemReplyBody::ArenaChunk);
    if (!reply.ok()) {
      // An error answers the whole request, before any chunk: the channel is still in step.
      return i == 0 && reply.status().code() != absl::StatusCode::kInternal
                 ? reply.status()
                 : Broken(reply.status());
    }
    if ((*reply)->body_as_ArenaChunk()->index() != first + i || !frame->fd.valid()) {
      return Broken(absl::InternalError(absl::StrCat(
          "memdaemon sent chunk ", (*reply)->body_as_ArenaChunk()->index(),
          frame->fd.valid() ? "" : " without its fd", "; expected chunk ", first + i)));
    }
    fds.push_back(std::move(frame->fd));
  }
  return fds;
}

absl::StatusOr<std::unique_ptr<ArenaClient>> ArenaClient::Attach(const std::string& socket_path,
                                                                 gpu::Device* device,
                                                                 uint32_t worker_id,
                                                                 const std::string& attach_secret) {
  std::unique_ptr<ArenaClient> client(new ArenaClient());
  PSWITCH_ASSIGN_OR_RETURN(client->channel_, proto::FrameChannel::Connect(socket_path));
  uint64_t id = client->next_request_id_;
  PSWITCH_ASSIGN_OR_RETURN(proto::ReceivedFrame frame,
                           client->Call([&](flatbuffers::FlatBufferBuilder& b, uint64_t rid) {
                             id = rid;
                             auto secret = b.CreateVector(
                                 reinterpret_cast<const uint8_t*>(attach_secret.data()),
                                 attach_secret.size());
                             auto attach =
                                 proto::CreateAttachArena(b, worker_id, ::getpid(), secret);
                             proto::Finish(b, proto::CreateMemRequest(
                                 b, rid, proto::MemRequestBody::AttachArena, attach.Union()));
                           }));
  PSWITCH_ASSIGN_OR_RETURN(const proto::MemReply* reply,
                           ParseReply(frame, id, proto::MemReplyBody::ArenaGrant));
  const proto::ArenaGrant* grant = reply->body_as_ArenaGrant();
  gpu::ArenaHandle handle;
  handle.backend =
      grant->backend() == proto::Backend::Cuda ? gpu::Backend::kCuda : gpu::Backend::kHost;
  if (handle.backend != device->backend()) {
    return absl::FailedPreconditionError(
        absl::StrCat("memdaemon runs the ", gpu::BackendName(handle.backend),
                     " backend, this worker ", gpu::BackendName(device->backend())));
  }
  handle.device_ordinal = grant->device_ordinal();
  handle.size_bytes = grant->size_bytes();
  if (grant->ipc_handle() != nullptr) {
    handle.ipc_handle.assign(reinterpret_cast<const char*>(grant->ipc_handle()->data()),
                             grant->ipc_handle()->size());
  }
  handle.fd = std::move(frame.fd);
  handle.chunk_bytes = grant->chunk_bytes();
  if (handle.chunk_bytes > 0) {
    // The arena is owned by the client, so it never outlives this source.
    handle.chunks = [c = client.get()](uint64_t first, uint64_t count) {
      return c->FetchChunks(first, count);
    };
  }
  uint64_t flags_offset = grant->flags_offset();
  uint32_t ready_count = grant->ready_flags();
  uint32_t drain_count = grant->drain_flags();
  client->alignment_ = grant->alignment();
  client->lease_alignment_ = grant->lease_alignment();
  PSWITCH_ASSIGN_OR_RETURN(client->arena_, device->ImportArena(std::move(handle)));
  PSWITCH_ASSIGN_OR_RETURN(client->ready_flags_, client->arena_->Flags(flags_offset, ready_count));
  PSWITCH_ASSIGN_OR_RETURN(
      client->drain_flags_,
      client->arena_->Flags(flags_offset + uint64_t{ready_count} * 4, drain_count));
  client->flags_offset_ = flags_offset;
  client->ready_bytes_ = uint64_t{ready_count} * 4;
  client->flags_bytes_ = (uint64_t{ready_count} + drain_count) * 4;
  return client;
}

absl::Status ArenaClient::RestrictToFlags() {
  // The flags are host words every importer maps whole (CUDA); the device bytes behind the
  // control block hold nothing.
  if (arena_->flags_outside_device_memory()) return arena_->RestrictAccess();
  const uint64_t page = arena_->access_granularity();
  if (page == 0 || (flags_offset_ + ready_bytes_) % page != 0) {
    return absl::FailedPreconditionError(
        "the drain flags share a page with the ready flags: no write grant would spare them");
  }
  PSWITCH_RETURN_IF_ERROR(arena_->RestrictAccess());
  // Workers only wait on ready flags (the copy engine writes them) and write drain flags; the
  // control block holds nothing else.
  PSWITCH_RETURN_IF_ERROR(
      arena_->SetAccess(flags_offset_, ready_bytes_, gpu::Arena::Access::kRead));
  return arena_->SetAccess(flags_offset_ + ready_bytes_, flags_bytes_ - ready_bytes_,
                           gpu::Arena::Access::kReadWrite);
}

absl::StatusOr<Lease> ArenaClient::RequestLease(const std::string& owner, uint64_t bytes) {
  uint64_t id = 0;
  PSWITCH_ASSIGN_OR_RETURN(
      proto::ReceivedFrame frame, Call([&](flatbuffers::FlatBufferBuilder& b, uint64_t rid) {
        id = rid;
        auto req = proto::CreateRequestLease(b, b.CreateString(owner), bytes);
        proto::Finish(b, proto::CreateMemRequest(b, rid, proto::MemRequestBody::RequestLease, req.Union()));
      }));
  PSWITCH_ASSIGN_OR_RETURN(const proto::MemReply* reply,
                           ParseReply(frame, id, proto::MemReplyBody::LeaseGranted));
  return Lease{reply->body_as_LeaseGranted()->offset(), reply->body_as_LeaseGranted()->bytes(),
               owner};
}

absl::Status ArenaClient::ReleaseLease(const std::string& owner, uint64_t offset) {
  uint64_t id = 0;
  PSWITCH_ASSIGN_OR_RETURN(
      proto::ReceivedFrame frame, Call([&](flatbuffers::FlatBufferBuilder& b, uint64_t rid) {
        id = rid;
        auto req = proto::CreateReleaseLease(b, b.CreateString(owner), offset);
        proto::Finish(b, proto::CreateMemRequest(b, rid, proto::MemRequestBody::ReleaseLease, req.Union()));
      }));
  return ParseReply(frame, id, proto::MemReplyBody::LeaseReleased).status();
}

}  // namespace pswitch::memdaemon
