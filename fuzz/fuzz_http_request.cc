// fuzz_http_request: bytes from the HTTP port's socket, through what pswitchd runs on them: Beast's
// request parser with pswitchd's header and body caps, the target split (frontend/http_target),
// and an infer body through the KServe v2 codec (frontend/kserve_codec), JSON or with the binary
// tensor data extension.
//
// Properties beyond "does not crash": the decoder reserves exactly the bytes the tensors it
// returns hold, every tensor it returns is valid, and the response written for those tensors is
// JSON a strict parser reads back with the same shapes. A header decoded ahead of its binary data
// (the HTTP port's receipt in place) accepts exactly what the whole body's decoding accepts, its
// parts lie inside the placement, apart, in order, adding up to the binary data, and receiving
// the data there gives the placement the whole body's decoding writes; the response in parts is
// the one-string response.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "frontend/http_target.h"
#include "frontend/kserve_codec.h"
#include "fuzz/check.h"
#include "nlohmann/json.hpp"

namespace pswitch::fuzz {
namespace {

void CheckDecoded(absl::string_view json_text, absl::string_view binary) {
  size_t reserved = 0;
  absl::StatusOr<frontend::InferRequest> r = frontend::DecodeInferRequest(
      json_text, binary, frontend::InferRequestLimits{1 << 20, 32, 16}, [&reserved](size_t n) {
        reserved = n;
        return absl::OkStatus();
      });
  if (!r.ok()) return;
  size_t held = 0;
  for (const proto::HostTensor& t : r->inputs) {
    PSWITCH_FUZZ_CHECK(proto::ValidateHostTensor(t).ok(), "an invalid tensor was decoded");
    held += t.data.size();
  }
  PSWITCH_FUZZ_CHECK(held == reserved, "the reservation differs from the decoded bytes");
  // The decoded inputs, written back as outputs, must read back as JSON with the same shapes.
  frontend::InferRequest plain;
  plain.id = r->id;
  size_t json_bytes = 0;
  const std::string body = frontend::EncodeInferResponse("m", plain, r->inputs, &json_bytes);
  const nlohmann::json back = nlohmann::json::parse(body, nullptr, false);
  PSWITCH_FUZZ_CHECK(!back.is_discarded(), "the response is not JSON");
  PSWITCH_FUZZ_CHECK(back["outputs"].size() == r->inputs.size(), "outputs lost");
  for (size_t i = 0; i < r->inputs.size(); ++i) {
    PSWITCH_FUZZ_CHECK(back["outputs"][i]["shape"] == r->inputs[i].shape, "shape changed");
  }
  // Every output as binary data: the response in parts is the one-string response.
  plain.all_outputs_binary = true;
  const std::string binary_body = frontend::EncodeInferResponse("m", plain, r->inputs, &json_bytes);
  std::vector<frontend::OutputView> views;
  for (const proto::HostTensor& t : r->inputs) {
    views.push_back(frontend::OutputView{&t, absl::MakeConstSpan(t.data)});
  }
  frontend::EncodedInferResponse parts = frontend::EncodeInferResponseParts("m", plain, views);
  std::string joined = parts.json;
  for (absl::Span<const uint8_t> b : parts.binary) {
    joined.append(reinterpret_cast<const char*>(b.data()), b.size());
  }
  PSWITCH_FUZZ_CHECK(joined == binary_body, "the response in parts differs");
}

// The same body decoded into a placement whole, and header first with its binary data received
// into the parts DecodeInferHeader names.
void CheckPlaced(absl::string_view json_text, absl::string_view binary) {
  constexpr size_t kMaxPlacement = 4 << 20;
  auto placement = [](std::vector<uint8_t>& memory) {
    return
        [&memory](size_t bytes, const std::vector<proto::HostTensor>&) -> absl::StatusOr<uint8_t*> {
          if (bytes > kMaxPlacement) return absl::ResourceExhaustedError("too large");
          memory.assign(bytes, 0xa5);
          return memory.data();
        };
  };
  const frontend::InferRequestLimits limits{1 << 20, 32, 16};
  std::vector<uint8_t> whole_memory, staged_memory;
  absl::StatusOr<frontend::InferRequest> whole =
      frontend::DecodeInferRequest(json_text, binary, limits, nullptr, placement(whole_memory));
  std::vector<frontend::BinaryPlacement> parts;
  absl::StatusOr<frontend::InferRequest> staged = frontend::DecodeInferHeader(
      json_text, binary.size(), limits, nullptr, placement(staged_memory), &parts);
  PSWITCH_FUZZ_CHECK(whole.ok() == staged.ok(), "the header-first decoding accepts otherwise");
  if (!staged.ok()) {
    PSWITCH_FUZZ_CHECK(parts.empty(), "a refused header places data");
    return;
  }
  uint64_t end = 0, total = 0;
  for (const frontend::BinaryPlacement& p : parts) {
    PSWITCH_FUZZ_CHECK(p.offset >= end, "binary parts overlap or run backwards");
    PSWITCH_FUZZ_CHECK(p.bytes > 0 && p.offset + p.bytes <= staged_memory.size(),
                       "a binary part lies outside the placement");
    end = p.offset + p.bytes;
    total += p.bytes;
  }
  PSWITCH_FUZZ_CHECK(total == binary.size(), "the binary parts do not add up to the data");
  size_t at = 0;
  for (const frontend::BinaryPlacement& p : parts) {
    std::memcpy(staged_memory.data() + p.offset, binary.data() + at, p.bytes);
    at += p.bytes;
  }
  PSWITCH_FUZZ_CHECK(staged_memory == whole_memory, "received in place, the inputs differ");
  PSWITCH_FUZZ_CHECK(staged->inputs.size() == whole->inputs.size(), "inputs differ");
  for (size_t i = 0; i < whole->inputs.size(); ++i) {
    PSWITCH_FUZZ_CHECK(staged->inputs[i].slice == whole->inputs[i].slice &&
                           staged->inputs[i].shape == whole->inputs[i].shape,
                       "an input's place or shape differs");
  }
}

}  // namespace
}  // namespace pswitch::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace http = boost::beast::http;
  http::request_parser<http::string_body> parser;
  parser.header_limit(16 << 10);
  parser.body_limit(1 << 20);
  parser.eager(true);
  boost::beast::error_code ec;
  size_t used = 0;
  while (used < size && !parser.is_done()) {
    const size_t n = parser.put(boost::asio::buffer(data + used, size - used), ec);
    if (ec || n == 0) break;
    used += n;
  }
  if (ec || !parser.is_header_done()) return 0;
  const auto& request = parser.get();
  std::string path;
  std::map<std::string, std::string> query;
  pswitch::frontend::SplitTarget(
      absl::string_view(request.target().data(), request.target().size()), &path, &query);
  if (!parser.is_done()) return 0;
  const std::string& body = request.body();
  absl::string_view json_text = body;
  absl::string_view binary;
  auto header = request.find("Inference-Header-Content-Length");
  if (header != request.end()) {
    size_t json_bytes = 0;
    if (!absl::SimpleAtoi(absl::string_view(header->value().data(), header->value().size()),
                          &json_bytes) ||
        json_bytes > body.size()) {
      return 0;
    }
    json_text = json_text.substr(0, json_bytes);
    binary = absl::string_view(body).substr(json_bytes);
  }
  pswitch::fuzz::CheckDecoded(json_text, binary);
  pswitch::fuzz::CheckPlaced(json_text, binary);
  return 0;
}
