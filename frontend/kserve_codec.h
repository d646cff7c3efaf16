// The Open Inference Protocol's (KServe v2) infer request and response as JSON, with Triton's
// binary tensor data extension: the one place the HTTP port turns bytes into tensors and back.
//
// A JSON body is decoded without building its tensors as a JSON document (which costs about 17x
// the body's size): a first pass keeps the request's structure and drops every "data" element,
// counting them; the decoded size is then reserved from the caller's budget; a second pass
// writes each element straight into its tensor's buffer. Peak memory is the body plus the
// tensors, both charged. No torch, no controller: the fuzzer links it alone.
#ifndef PSWITCH_FRONTEND_KSERVE_CODEC_H_
#define PSWITCH_FRONTEND_KSERVE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/host_tensor.h"

namespace pswitch::frontend {

// KServe v2 datatype names ("FP32", ...) of the dtypes the protocol carries; nullopt otherwise.
std::optional<proto::DType> KserveDType(absl::string_view name);
const char* KserveDTypeName(proto::DType dtype);

struct InferRequestLimits {
  size_t max_json_bytes = 64 << 20;
  int max_depth = 32;
  size_t max_inputs = 16;
};

// Triton's shared-memory parameters on a tensor ("shared_memory_region", "..._byte_size",
// "..._offset"): `bytes` at `offset` of the caller's registered region `region`.
struct ShmReference {
  std::string region;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

struct InferRequest {
  // Inline, or (an input given as shared memory) Place::Region with slice.offset/length set and
  // slice.region 0: the port resolves `input_regions[i]`, the region's name, to its id.
  std::vector<proto::HostTensor> inputs;
  std::vector<std::optional<ShmReference>> input_regions;  // parallel to `inputs`
  // Outputs asked for in shared memory, by output name, in request order.
  std::vector<std::pair<std::string, ShmReference>> output_regions;
  std::optional<int> priority;              // "parameters"."priority", clamped to +-1e6
  std::optional<uint64_t> timeout_us;       // "parameters"."timeout", at most a day
  // "parameters"."pswitch_online_slo_ms": online fill work served in a main job's bubble within
  // this latency objective (milliseconds, fractions allowed), in microseconds; ParseTask's
  // bounds apply (ParseOnlineObjective).
  std::optional<uint64_t> online_slo_us;
  std::string id;                           // echoed in the response ("" if absent or not text)
  bool all_outputs_binary = false;          // "parameters"."binary_data_output"
  std::vector<std::string> binary_outputs;  // outputs asked for one by one as binary data
  bool WantsBinary(const std::string& output) const;
};

// Called once, before any tensor is built, with the bytes the decoded inputs will take; an error
// stops the decoding and is returned.
using ReserveBytes = std::function<absl::Status(size_t bytes)>;

// Where decoded inputs go instead of their own `data`: called once, after `reserve`, with the
// bytes the inputs take packed (each at a multiple of kPlacementAlignment; 0 when none is decoded
// here) and the inputs' names, dtypes and shapes; returns memory of at least that many bytes for
// the codec to fill (null only for 0 bytes), or an error, which stops the decoding. The inputs
// are then Place::Region slices of it (slice.region 0, for the caller to set), an empty input
// staying inline.
using PlaceInputs = std::function<absl::StatusOr<uint8_t*>(
    size_t bytes, const std::vector<proto::HostTensor>& heads)>;
inline constexpr uint64_t kPlacementAlignment = 64;

// Decodes a request: `json_text` (the whole body, or the header that
// Inference-Header-Content-Length delimits) and `binary` (the bytes after it). InvalidArgument
// saying what is wrong, never echoing the text. Without `place`, each input gets its own `data`.
absl::StatusOr<InferRequest> DecodeInferRequest(absl::string_view json_text,
                                                absl::string_view binary,
                                                const InferRequestLimits& limits,
                                                const ReserveBytes& reserve,
                                                const PlaceInputs& place = nullptr);

// Where one part of a request's binary data goes when it has not arrived yet: `bytes` at
// `offset` of the placement PlaceInputs gave.
struct BinaryPlacement {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// DecodeInferRequest for a request whose `binary_bytes` of binary data have not been read yet,
// so that they can be received straight into their inputs' places: everything but the copy of
// the binary inputs' bytes, which `*binary_to` says where to put instead (in the order the data
// comes; their sizes add up to `binary_bytes`; empty on error). `place` is required; the inputs
// come back as DecodeInferRequest's do with a placement.
absl::StatusOr<InferRequest> DecodeInferHeader(absl::string_view json_text, uint64_t binary_bytes,
                                               const InferRequestLimits& limits,
                                               const ReserveBytes& reserve,
                                               const PlaceInputs& place,
                                               std::vector<BinaryPlacement>* binary_to);

// One output as a response encodes it: its name, dtype, shape (and where it was placed) from
// `*head`, its bytes from `bytes`, wherever they lie (a staging region's mapping, or head->data).
struct OutputView {
  const proto::HostTensor* head = nullptr;
  absl::Span<const uint8_t> bytes;
};
// A response in parts: the JSON (the whole body when `binary` is empty) and, after it, the
// binary outputs' bytes in order, as spans of the views' bytes (nothing copied). When the
// binary parts hold any byte, the JSON's size is the Inference-Header-Content-Length.
struct EncodedInferResponse {
  std::string json;
  std::vector<absl::Span<const uint8_t>> binary;
};
EncodedInferResponse EncodeInferResponseParts(const std::string& model, const InferRequest& request,
                                              const std::vector<OutputView>& outputs);

// The response body. Outputs `request.WantsBinary` are sent as binary data after the JSON
// header; `*json_bytes` is then that header's size (for Inference-Header-Content-Length), else 0.
// An output in a region (Place::Region, written where the request's output_regions said) is
// listed with its shared_memory_* parameters and no data, as Triton does.
std::string EncodeInferResponse(const std::string& model, const InferRequest& request,
                                const std::vector<proto::HostTensor>& outputs, size_t* json_bytes);

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_KSERVE_CODEC_H_
