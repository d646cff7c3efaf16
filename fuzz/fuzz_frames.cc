// fuzz_frames: a byte stream as a pswitch socket delivers it, read the way pswitchd reads it.
//
// Input: byte 0 picks how the rest arrives (0: in one read; n > 0: reads of 1..n bytes, their
// sizes drawn from a generator seeded with n), the rest is the stream. The stream goes through
// proto::FrameDecoder; the payloads and the final error must be the same however the stream was
// split, and the same as a plain reading of the length prefixes. Every payload is verified as
// every root message type, and a ClientRequest that verifies has every field of its body read
// as the server's handlers read them (strings, tensors, the bubble-cycle JSON).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "base/text.h"
#include "fill/bubble_cycle.h"
#include "fuzz/check.h"
#include "proto/client_generated.h"
#include "proto/common_generated.h"
#include "proto/framing.h"
#include "proto/host_tensor.h"
#include "proto/memdaemon_generated.h"
#include "proto/worker_generated.h"

namespace pswitch::fuzz {
namespace {

using proto::ClientRequestBody;

struct Decoded {
  std::vector<std::vector<uint8_t>> payloads;
  absl::Status error;
};

// The framing format read directly: 4-byte little-endian length, then the payload.
Decoded ReferenceDecode(std::span<const uint8_t> stream, uint32_t max_frame_bytes) {
  Decoded out;
  size_t pos = 0;
  while (stream.size() - pos >= proto::kFrameHeaderBytes) {
    const uint32_t length = uint32_t{stream[pos]} | uint32_t{stream[pos + 1]} << 8 |
                            uint32_t{stream[pos + 2]} << 16 | uint32_t{stream[pos + 3]} << 24;
    if (length == 0 || length > max_frame_bytes) {
      out.error = absl::InvalidArgumentError("bad length");
      break;
    }
    if (stream.size() - pos - proto::kFrameHeaderBytes < length) break;
    const uint8_t* begin = stream.data() + pos + proto::kFrameHeaderBytes;
    out.payloads.emplace_back(begin, begin + length);
    pos += proto::kFrameHeaderBytes + length;
  }
  return out;
}

// Feeds `stream` to a FrameDecoder in reads of the sizes `chunking` picks, checking
// BytesNeeded's promise: no frame completes before that many more bytes have arrived.
Decoded DecoderDecode(std::span<const uint8_t> stream, uint8_t chunking, uint32_t max_frame_bytes) {
  proto::FrameDecoder decoder(max_frame_bytes);
  Decoded out;
  uint64_t rng = 0x9e3779b97f4a7c15ull ^ chunking;
  size_t pos = 0;
  size_t needed = 0, arrived = 0;  // since the decoder last asked for more
  while (pos < stream.size() && out.error.ok()) {
    size_t read = stream.size() - pos;
    if (chunking != 0) {
      rng ^= rng << 13;
      rng ^= rng >> 7;
      rng ^= rng << 17;
      read = std::min<size_t>(read, 1 + rng % chunking);
    }
    decoder.Append(stream.subspan(pos, read));
    pos += read;
    arrived += read;
    while (true) {
      absl::StatusOr<std::optional<std::vector<uint8_t>>> next = decoder.Next();
      if (!next.ok()) {
        out.error = next.status();
        // A failed decoder stays failed.
        PSWITCH_FUZZ_CHECK(!decoder.Next().ok(), "decoder recovered from an error");
        break;
      }
      if (!next->has_value()) {
        needed = decoder.BytesNeeded();
        PSWITCH_FUZZ_CHECK(needed >= 1, "BytesNeeded() is 0 while a frame is incomplete");
        arrived = 0;
        break;
      }
      PSWITCH_FUZZ_CHECK(arrived >= needed, "a frame completed before BytesNeeded() arrived");
      needed = 0;
      out.payloads.push_back(std::move(**next));
    }
  }
  return out;
}

void ReadText(ReadSink& sink, const flatbuffers::String* text, const char* what, size_t max_bytes) {
  if (text == nullptr) return;
  const std::string value = text->str();
  sink.Text(value);
  sink.Value(base::CheckText(value, what, max_bytes).ok());
}

void ReadTensors(ReadSink& sink,
                 const flatbuffers::Vector<flatbuffers::Offset<proto::Tensor>>* tensors) {
  absl::StatusOr<std::vector<proto::HostTensor>> host = proto::FromWireTensors(tensors);
  if (!host.ok()) return;
  for (const proto::HostTensor& tensor : *host) {
    sink.Text(tensor.name);
    sink.Value(tensor.dtype);
    sink.Bytes(tensor.shape.data(), tensor.shape.size() * sizeof(int64_t));
    sink.Bytes(tensor.data.data(), tensor.data.size());
  }
}

void ReadFillSubmit(ReadSink& sink, const proto::FillSubmit& job) {
  sink.Value(job.kind());
  sink.Text(proto::EnumNameFillKind(job.kind()));
  ReadText(sink, job.model(), "model name", 128);
  ReadText(sink, job.dataset_path(), "dataset", 4096);
  ReadText(sink, job.output_path(), "output", 4096);
  sink.Value(job.batch());
  sink.Value(job.steps());
  sink.Value(job.seed());
  sink.Value(job.step_us());
  sink.Value(job.memory_bytes());
  sink.Value(job.deadline_ms());
  sink.Value(job.synthetic_step_us());
  sink.Value(job.synthetic_alloc_bytes());
  sink.Value(job.test_only_ignore_pause());
}

// Every field of every body, as controller/client_server.cc's handlers read them; the fields
// the schema marks required are dereferenced unchecked, as the handlers do.
void ReadClientRequest(const proto::ClientRequest& request) {
  ReadSink sink;
  sink.Value(request.request_id());
  sink.Text(proto::EnumNameClientRequestBody(request.body_type()));
  switch (request.body_type()) {
    case ClientRequestBody::RegisterModel: {
      const auto& body = *request.body_as_RegisterModel();
      ReadText(sink, body.name(), "model name", 128);
      sink.Text(body.name()->str());
      ReadText(sink, body.zoo_model(), "architecture", 128);
      sink.Text(body.zoo_model()->str());
      ReadText(sink, body.weights_path(), "weights path", 4096);
      ReadText(sink, body.plan_path(), "plan path", 4096);
      ReadText(sink, body.archive_path(), "archive path", 4096);
      sink.Value(body.batch_size());
      break;
    }
    case ClientRequestBody::SubmitTask: {
      const auto& body = *request.body_as_SubmitTask();
      ReadText(sink, body.model(), "model name", 128);
      sink.Text(body.model()->str());
      sink.Text(proto::EnumNameTaskKind(body.kind()));
      ReadTensors(sink, body.inputs());
      sink.Value(body.iterations());
      sink.Value(body.seed());
      sink.Value(body.priority());
      sink.Value(body.deadline_ms());
      sink.Text(proto::EnumNameOptimizer(body.optimizer()));
      sink.Value(body.learning_rate());
      sink.Value(body.momentum());
      sink.Value(body.batch_size());
      break;
    }
    case ClientRequestBody::QueryTask:
      sink.Value(request.body_as_QueryTask()->task_id());
      break;
    case ClientRequestBody::CancelTask:
      sink.Value(request.body_as_CancelTask()->task_id());
      break;
    case ClientRequestBody::UnloadModel: {
      const auto& body = *request.body_as_UnloadModel();
      ReadText(sink, body.name(), "model name", 128);
      sink.Text(body.name()->str());
      break;
    }
    case ClientRequestBody::ListModels:
      sink.Value(request.body_as_ListModels() != nullptr);
      break;
    case ClientRequestBody::ListTasks:
      sink.Value(request.body_as_ListTasks()->limit());
      break;
    case ClientRequestBody::BubbleBegin: {
      const auto& body = *request.body_as_BubbleBegin();
      sink.Value(body.gpu());
      sink.Value(body.expected_duration_us());
      sink.Value(body.free_bytes());
      sink.Value(body.began_ns());
      break;
    }
    case ClientRequestBody::BubbleEnd:
      sink.Value(request.body_as_BubbleEnd()->gpu());
      break;
    case ClientRequestBody::RegisterBubbleCycle: {
      const auto& body = *request.body_as_RegisterBubbleCycle();
      sink.Value(body.gpu());
      sink.Value(body.origin_ns());
      absl::StatusOr<fill::BubbleCycle> cycle =
          fill::ParseBubbleCycleJson(body.cycle_json()->str());
      sink.Value(cycle.ok());
      if (cycle.ok()) sink.Value(cycle->bubbles.size());
      break;
    }
    case ClientRequestBody::FillSubmit:
      ReadFillSubmit(sink, *request.body_as_FillSubmit());
      break;
    case ClientRequestBody::FillEstimateQuery:
      ReadFillSubmit(sink, *request.body_as_FillEstimateQuery()->job());
      break;
    case ClientRequestBody::FillQuery:
      sink.Value(request.body_as_FillQuery()->job_id());
      break;
    case ClientRequestBody::FillCancel:
      sink.Value(request.body_as_FillCancel()->job_id());
      break;
    case ClientRequestBody::FillStatsQuery:
      sink.Value(request.body_as_FillStatsQuery() != nullptr);
      break;
    case ClientRequestBody::Authenticate:
      ReadText(sink, request.body_as_Authenticate()->token(), "token", 4096);
      break;
    default:
      break;  // NONE or a type this build does not know: the server refuses it
  }
}

template <typename T>
bool Verifies(std::span<const uint8_t> payload) {
  return proto::VerifyPayload<T>(payload, "fuzz").ok();
}

void HandlePayload(std::span<const uint8_t> payload) {
  absl::StatusOr<const proto::ClientRequest*> request =
      proto::VerifyPayload<proto::ClientRequest>(payload, "client request");
  if (request.ok()) ReadClientRequest(**request);
  // Each identifier names one type: a payload verifies as at most one root.
  const int roots = request.ok() + Verifies<proto::ControllerReply>(payload) +
                    Verifies<proto::WorkerCommand>(payload) +
                    Verifies<proto::WorkerEvent>(payload) + Verifies<proto::MemRequest>(payload) +
                    Verifies<proto::MemReply>(payload);
  PSWITCH_FUZZ_CHECK(roots <= 1, "a payload verified as more than one root type");
}

}  // namespace
}  // namespace pswitch::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pswitch;
  if (size == 0) return 0;
  const uint8_t chunking = data[0];
  const std::span<const uint8_t> stream(data + 1, size - 1);
  const uint32_t max_frame_bytes = proto::kDefaultMaxFrameBytes;

  const fuzz::Decoded expected = fuzz::ReferenceDecode(stream, max_frame_bytes);
  const fuzz::Decoded whole = fuzz::DecoderDecode(stream, 0, max_frame_bytes);
  const fuzz::Decoded chunked = fuzz::DecoderDecode(stream, chunking, max_frame_bytes);
  for (const fuzz::Decoded* got : {&whole, &chunked}) {
    PSWITCH_FUZZ_CHECK(got->payloads == expected.payloads, "decoded payloads differ");
    PSWITCH_FUZZ_CHECK(got->error.ok() == expected.error.ok(), "decoder errors differ");
  }
  for (const std::vector<uint8_t>& payload : chunked.payloads) fuzz::HandlePayload(payload);
  return 0;
}
