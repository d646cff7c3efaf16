// Triton's binary tensor data received in place on the HTTP port (docs/dataplane.md, "HTTP
// binary"): an infer body's JSON header is read into a small string and decoded first, a staging
// region is leased from the connection's pool with room for the outputs, and the binary data is
// then received by the kernel straight into the inputs' places in it (HttpService::PlaceBody).
// The answer's binary outputs are sent from the region where the worker wrote them
// (HttpResponse::tail). pswitchd copies none of the tensors' bytes.
#ifndef PSWITCH_FRONTEND_HTTP_STAGING_H_
#define PSWITCH_FRONTEND_HTTP_STAGING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dataplane/transfer_region.h"
#include "frontend/byte_budget.h"
#include "frontend/http_message.h"
#include "frontend/kserve_codec.h"
#include "frontend/staging_pool.h"
#include "proto/host_tensor.h"

namespace pswitch::frontend {

// The largest JSON header decoded before its binary data is read (on the event loop); a request
// with a larger one is read whole and decoded on a handler thread, as a JSON body is.
inline constexpr uint64_t kMaxPlacedHeaderBytes = 64 << 10;

// The size of the JSON header of an infer body of `body_bytes` to receive in place: its
// Inference-Header-Content-Length, when that is a number within the body, at most
// kMaxPlacedHeaderBytes, and followed by binary data. nullopt otherwise (the body is then read
// whole, and its errors reported as before).
std::optional<uint64_t> PlacedHeaderBytes(const HttpRequest& head, uint64_t body_bytes);

// One HTTP connection's staging: a StagingPool for the principal whose requests fill it,
// charged to the budget's client, replaced (its idle regions dropped) when either changes.
// Not thread-safe: the connection's event loop only (leases may end anywhere).
class ConnectionStaging {
 public:
  StagingPool& PoolFor(const std::string& owner, std::shared_ptr<ByteBudget> budget,
                       const std::string& client);
  ~ConnectionStaging();

 private:
  std::shared_ptr<StagingPool> pool_;
  std::string client_;
};

// An infer request whose JSON header is decoded and whose binary data is received into `lease`.
class StagedInfer : public PlacedBody {
 public:
  std::string owner;     // the principal it was decoded for
  InferRequest request;  // its inputs Place::Region slices of the lease's region (id set)
  std::shared_ptr<StagingPool::Lease> lease;
  std::optional<proto::ByteSlice> output_room;  // in the lease's region, when the size is known
};

// Bytes a model's output takes for these inputs, or nullopt when that cannot be told (an
// unknown model, inputs admission will refuse): then no room is made for it.
using OutputBytesFor =
    std::function<std::optional<uint64_t>(const std::vector<proto::HostTensor>& inputs)>;

// Decodes `header` (an infer body's JSON part, followed by `binary_bytes` > 0 of binary data not
// read yet) for `owner` and leases from `pool` a region for its inputs and, 64-byte aligned
// after them, its output; `spans` are where the binary data goes, in order. The decoder's errors
// (InvalidArgument), the pool's (ResourceExhausted when the budget is full).
absl::StatusOr<std::shared_ptr<StagedInfer>> StageInfer(absl::string_view header,
                                                        uint64_t binary_bytes,
                                                        const InferRequestLimits& limits,
                                                        std::string owner, StagingPool& pool,
                                                        const OutputBytesFor& output_bytes);

// The outputs of a task for the response: those that lie in `region` (Place::Region slices of
// it) become inline outputs viewed where they lie, at `base` (the region's mapping, which must
// outlive the views); the others are viewed in their own data. OutOfRange for a slice outside
// the region.
absl::StatusOr<std::vector<OutputView>> ViewOutputsIn(const dataplane::TransferRegion& region,
                                                      const uint8_t* base,
                                                      std::vector<proto::HostTensor>& outputs);

// The response to an infer whose task returned `outputs`. Outputs in `staged` (may be null) are
// read where the worker wrote them, through `lease` (the connection's, when the request was
// received in place) or else a read-only mapping of the region; binary ones become the
// response's tail, which then owns the mapping, the lease and `charge` until it is written.
// Without a tail they are let go when this returns. OutOfRange for an output outside its region.
absl::StatusOr<HttpResponse> EncodeInferAnswer(
    const std::string& model, const InferRequest& request, std::vector<proto::HostTensor>& outputs,
    const std::shared_ptr<const dataplane::TransferRegion>& staged,
    std::shared_ptr<StagingPool::Lease> lease, BudgetCharge charge);

// The W3C Server-Timing value for an infer's answer: milliseconds from the request's first byte
// to its first layer's start and to now ("first-layer;dur=0.412, total;dur=0.705"), the same
// breakdown the framed ports return. Empty when the port stamped no arrival.
std::string ServerTiming(int64_t arrival_ns, int64_t first_layer_start_ns, int64_t now_ns);

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_HTTP_STAGING_H_
