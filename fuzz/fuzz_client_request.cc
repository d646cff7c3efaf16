// fuzz_client_request: one client request payload, verified as pswitchd's client server verifies
// it, then through the same validation every handler runs (controller/requests: registration,
// task, fill job, bubble cycle and begin).
//
// Properties beyond "does not crash": what a parse accepts is within its documented bounds
// (names and paths are checked text, durations finite and at most a day, known enums), and no
// error message quotes a client string that failed its text check.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "base/text.h"
#include "controller/requests.h"
#include "fuzz/check.h"
#include "proto/framing.h"

namespace {

using namespace pswitch;  // NOLINT: a fuzz target's entry point

void CheckText(const std::string& text, size_t max_bytes, const char* what) {
  PSWITCH_FUZZ_CHECK(base::CheckText(text, what, max_bytes).ok(),
                     std::string(what) + " was accepted without passing its text check");
}

void CheckDuration(absl::Duration d, const char* what) {
  PSWITCH_FUZZ_CHECK(d >= absl::ZeroDuration() && d <= absl::Hours(24),
                     std::string(what) + " outside [0, a day]");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto request = proto::VerifyPayload<proto::ClientRequest>(std::span<const uint8_t>(data, size),
                                                            "client request");
  if (!request.ok()) return 0;
  const proto::ClientRequest& r = **request;
  switch (r.body_type()) {
    case proto::ClientRequestBody::RegisterModel: {
      auto parsed = controller::ParseRegistration(*r.body_as_RegisterModel());
      if (!parsed.ok()) break;
      CheckText(parsed->name, controller::kMaxNameBytes, "model name");
      CheckText(parsed->zoo_model, controller::kMaxNameBytes, "architecture");
      CheckText(parsed->weights_path, controller::kMaxPathBytes, "weights path");
      CheckText(parsed->plan, controller::kMaxPathBytes, "plan");
      CheckText(parsed->archive_path, controller::kMaxPathBytes, "archive path");
      PSWITCH_FUZZ_CHECK(!parsed->plan.empty(), "an empty plan is \"auto\"");
      break;
    }
    case proto::ClientRequestBody::UnloadModel: {
      auto parsed = controller::ParseUnload(*r.body_as_UnloadModel());
      if (!parsed.ok()) break;
      CheckText(*parsed, controller::kMaxNameBytes, "model name");
      PSWITCH_FUZZ_CHECK(!parsed->empty(), "an empty model name was accepted");
      break;
    }
    case proto::ClientRequestBody::SubmitTask: {
      auto parsed = controller::ParseTask(*r.body_as_SubmitTask());
      if (!parsed.ok()) break;
      CheckText(parsed->model, controller::kMaxNameBytes, "model name");
      PSWITCH_FUZZ_CHECK(parsed->inputs.size() <= controller::kMaxInputTensors, "too many inputs");
      for (const proto::HostTensor& t : parsed->inputs) {
        CheckText(t.name, controller::kMaxNameBytes, "input name");
        PSWITCH_FUZZ_CHECK(proto::ValidateHostTensor(t).ok(), "an invalid tensor was accepted");
      }
      if (parsed->deadline) CheckDuration(*parsed->deadline, "task deadline");
      PSWITCH_FUZZ_CHECK(!parsed->adam || parsed->momentum == 0, "Adam has no momentum");
      break;
    }
    case proto::ClientRequestBody::FillSubmit:
    case proto::ClientRequestBody::FillEstimateQuery: {
      const proto::FillSubmit& wire = r.body_type() == proto::ClientRequestBody::FillSubmit
                                          ? *r.body_as_FillSubmit()
                                          : *r.body_as_FillEstimateQuery()->job();
      auto parsed = controller::ParseFill(wire);
      if (!parsed.ok()) break;
      CheckText(parsed->model, controller::kMaxNameBytes, "fill model");
      CheckText(parsed->dataset_path, controller::kMaxPathBytes, "dataset");
      CheckText(parsed->output_path, controller::kMaxPathBytes, "output");
      CheckDuration(parsed->step, "fill step");
      CheckDuration(parsed->synthetic_step, "synthetic step");
      if (parsed->deadline) CheckDuration(*parsed->deadline, "fill deadline");
      break;
    }
    case proto::ClientRequestBody::RegisterBubbleCycle: {
      // A fixed clock: the origin arithmetic must hold for any origin_ns.
      const uint64_t now_ns = 1'000'000'000'000ull;
      const absl::Time now = absl::FromUnixSeconds(2'000'000'000);
      auto parsed = controller::ParseCycle(*r.body_as_RegisterBubbleCycle(), now_ns, now);
      if (!parsed.ok()) break;
      if (parsed->origin) {
        PSWITCH_FUZZ_CHECK(*parsed->origin <= now && *parsed->origin > absl::InfinitePast(),
                           "a cycle origin after now or unbounded");
      }
      break;
    }
    case proto::ClientRequestBody::BubbleBegin: {
      const controller::BubbleBeginRequest begin =
          controller::ParseBubbleBegin(*r.body_as_BubbleBegin());
      CheckDuration(begin.expected, "bubble duration");
      break;
    }
    default:
      break;
  }
  return 0;
}
