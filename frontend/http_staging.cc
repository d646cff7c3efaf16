#include "frontend/http_staging.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"

namespace pswitch::frontend {

std::optional<uint64_t> PlacedHeaderBytes(const HttpRequest& head, uint64_t body_bytes) {
  if (!head.has_header("Inference-Header-Content-Length")) return std::nullopt;
  uint64_t json_bytes = 0;
  if (!absl::SimpleAtoi(head.header("Inference-Header-Content-Length"), &json_bytes) ||
      json_bytes >= body_bytes || json_bytes > kMaxPlacedHeaderBytes) {
    return std::nullopt;
  }
  return json_bytes;
}

StagingPool& ConnectionStaging::PoolFor(const std::string& owner,
                                        std::shared_ptr<ByteBudget> budget,
                                        const std::string& client) {
  if (pool_ == nullptr || pool_->owner() != owner || client_ != client) {
    if (pool_ != nullptr) pool_->DropIdle();
    client_ = client;
    // One idle region: a connection's requests are one at a time, and an idle region stays
    // charged to its client.
    pool_ = StagingPool::Create(owner, BudgetCharge(std::move(budget), client), /*max_idle=*/1);
  }
  return *pool_;
}

ConnectionStaging::~ConnectionStaging() {
  // Regions still leased return to the pool (which their leases keep) and are dropped then.
  if (pool_ != nullptr) pool_->DropIdle();
}

absl::StatusOr<std::shared_ptr<StagedInfer>> StageInfer(absl::string_view header,
                                                        uint64_t binary_bytes,
                                                        const InferRequestLimits& limits,
                                                        std::string owner, StagingPool& pool,
                                                        const OutputBytesFor& output_bytes) {
  auto staged = std::make_shared<StagedInfer>();
  staged->owner = std::move(owner);
  auto place = [&](size_t bytes,
                   const std::vector<proto::HostTensor>& heads) -> absl::StatusOr<uint8_t*> {
    uint64_t total = bytes;
    if (std::optional<uint64_t> out = output_bytes(heads); out.has_value() && *out > 0) {
      const uint64_t at =
          (bytes + kPlacementAlignment - 1) / kPlacementAlignment * kPlacementAlignment;
      staged->output_room = proto::ByteSlice{0, at, *out};
      total = at + *out;
    }
    if (total == 0) return nullptr;
    // The pool charges the region's bytes to the client before it maps them.
    PSWITCH_ASSIGN_OR_RETURN(staged->lease, pool.Acquire(total));
    return staged->lease->data();
  };
  std::vector<BinaryPlacement> binary_to;
  PSWITCH_ASSIGN_OR_RETURN(
      staged->request,
      DecodeInferHeader(header, binary_bytes, limits, /*reserve=*/nullptr, place, &binary_to));
  if (staged->lease == nullptr) {  // the decoder gives binary data's bytes a place
    return absl::InternalError("binary data with no staging region");
  }
  const uint64_t region = staged->lease->region()->id();
  for (size_t i = 0; i < staged->request.inputs.size(); ++i) {
    proto::HostTensor& t = staged->request.inputs[i];
    const bool in_shared_memory =
        i < staged->request.input_regions.size() && staged->request.input_regions[i].has_value();
    if (t.place == proto::Place::Region && !in_shared_memory) t.slice.region = region;
  }
  if (staged->output_room) staged->output_room->region = region;
  for (const BinaryPlacement& part : binary_to) {
    staged->spans.emplace_back(staged->lease->data() + part.offset, part.bytes);
  }
  return staged;
}

absl::StatusOr<std::vector<OutputView>> ViewOutputsIn(const dataplane::TransferRegion& region,
                                                      const uint8_t* base,
                                                      std::vector<proto::HostTensor>& outputs) {
  std::vector<OutputView> views;
  views.reserve(outputs.size());
  for (proto::HostTensor& t : outputs) {
    if (t.place == proto::Place::Region && t.slice.region == region.id()) {
      PSWITCH_RETURN_IF_ERROR(region.CheckSlice(t.slice.offset, t.slice.length));
      views.push_back(
          OutputView{&t, absl::Span<const uint8_t>(base + t.slice.offset, t.slice.length)});
      t.place = proto::Place::Inline;
      t.slice = proto::ByteSlice{};
      continue;
    }
    views.push_back(OutputView{&t, absl::Span<const uint8_t>(t.data.data(), t.data.size())});
  }
  return views;
}

absl::StatusOr<HttpResponse> EncodeInferAnswer(
    const std::string& model, const InferRequest& request, std::vector<proto::HostTensor>& outputs,
    const std::shared_ptr<const dataplane::TransferRegion>& staged,
    std::shared_ptr<StagingPool::Lease> lease, BudgetCharge charge) {
  // What the response's tail points into, kept until the tail is written.
  struct TailOwner {
    std::shared_ptr<StagingPool::Lease> lease;
    std::unique_ptr<StagingMapping> mapping;
    BudgetCharge charge;
  };
  auto owner = std::make_shared<TailOwner>();
  owner->lease = std::move(lease);
  owner->charge = std::move(charge);
  std::vector<OutputView> views;
  if (staged != nullptr) {
    const uint8_t* base = nullptr;
    if (owner->lease != nullptr && owner->lease->region() == staged) {
      base = owner->lease->data();
    } else {
      for (const proto::HostTensor& t : outputs) {
        if (t.place != proto::Place::Region || t.slice.region != staged->id()) continue;
        PSWITCH_ASSIGN_OR_RETURN(owner->mapping, StagingMapping::Read(staged));
        base = owner->mapping->data();
        break;
      }
    }
    PSWITCH_ASSIGN_OR_RETURN(views, ViewOutputsIn(*staged, base, outputs));
  } else {
    for (proto::HostTensor& t : outputs) {
      views.push_back(OutputView{&t, absl::Span<const uint8_t>(t.data.data(), t.data.size())});
    }
  }
  EncodedInferResponse parts = EncodeInferResponseParts(model, request, views);
  uint64_t binary_bytes = 0;
  for (absl::Span<const uint8_t> b : parts.binary) binary_bytes += b.size();
  HttpResponse res;
  res.status = 200;
  res.content_type = "application/json";
  if (binary_bytes > 0) {
    res.content_type = "application/octet-stream";
    res.set_header("Inference-Header-Content-Length", std::to_string(parts.json.size()));
    res.tail = std::move(parts.binary);
    res.tail_owner = std::move(owner);
  }
  res.body = std::move(parts.json);
  return res;
}

std::string ServerTiming(int64_t arrival_ns, int64_t first_layer_start_ns, int64_t now_ns) {
  if (arrival_ns <= 0 || now_ns < arrival_ns) return "";
  auto ms = [arrival_ns](int64_t ns) { return static_cast<double>(ns - arrival_ns) / 1e6; };
  std::string value;
  if (first_layer_start_ns >= arrival_ns) {
    value = absl::StrFormat("first-layer;dur=%.3f, ", ms(first_layer_start_ns));
  }
  return value + absl::StrFormat("total;dur=%.3f", ms(now_ns));
}

}  // namespace pswitch::frontend
