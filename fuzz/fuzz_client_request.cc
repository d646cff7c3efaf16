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

#include "absl/strings/match.h"
#include "base/text.h"
#include "frontend/requests.h"
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
      auto parsed = frontend::ParseRegistration(*r.body_as_RegisterModel());
      if (!parsed.ok()) break;
      CheckText(parsed->name, frontend::kMaxNameBytes, "model name");
      CheckText(parsed->zoo_model, frontend::kMaxNameBytes, "architecture");
      CheckText(parsed->weights_path, frontend::kMaxPathBytes, "weights path");
      CheckText(parsed->plan, frontend::kMaxPathBytes, "plan");
      CheckText(parsed->archive_path, frontend::kMaxPathBytes, "archive path");
      PSWITCH_FUZZ_CHECK(!parsed->plan.empty(), "an empty plan is \"auto\"");
      PSWITCH_FUZZ_CHECK(parsed->trainers.size() <= frontend::kMaxTrainers, "too many trainers");
      for (const std::string& trainer : parsed->trainers) {
        CheckText(trainer, frontend::kMaxNameBytes, "trainer name");
        PSWITCH_FUZZ_CHECK(!trainer.empty(), "an empty trainer name was accepted");
      }
      break;
    }
    case proto::ClientRequestBody::UnloadModel: {
      auto parsed = frontend::ParseUnload(*r.body_as_UnloadModel());
      if (!parsed.ok()) break;
      CheckText(*parsed, frontend::kMaxNameBytes, "model name");
      PSWITCH_FUZZ_CHECK(!parsed->empty(), "an empty model name was accepted");
      break;
    }
    case proto::ClientRequestBody::SubmitTask: {
      const absl::Time now = absl::FromUnixSeconds(1'800'000'000);
      auto parsed = frontend::ParseTask(*r.body_as_SubmitTask(), now);
      if (!parsed.ok()) break;
      const controller::TaskSpec& spec = parsed->spec;
      CheckText(spec.model, frontend::kMaxNameBytes, "model name");
      PSWITCH_FUZZ_CHECK(spec.inputs.size() <= frontend::kMaxInputTensors, "too many inputs");
      for (const proto::HostTensor& t : spec.inputs) {
        CheckText(t.name, frontend::kMaxNameBytes, "input name");
        PSWITCH_FUZZ_CHECK(proto::ValidateHostTensor(t).ok(), "an invalid tensor was accepted");
      }
      if (spec.deadline != absl::InfiniteFuture()) {
        CheckDuration(spec.deadline - now, "task deadline");
      }
      PSWITCH_FUZZ_CHECK(
          spec.trainer.optimizer != api::OptimizerKind::kAdam || spec.trainer.momentum == 0,
          "Adam has no momentum");
      CheckText(parsed->as_model, frontend::kMaxNameBytes, "copy name");
      PSWITCH_FUZZ_CHECK(parsed->as_model.empty() || spec.kind == controller::TaskKind::kTraining,
                         "only training trains a copy");
      PSWITCH_FUZZ_CHECK(!absl::StartsWith(parsed->as_model, controller::kFillModelPrefix),
                         "a copy took a fill job's name");
      break;
    }
    case proto::ClientRequestBody::FillSubmit:
    case proto::ClientRequestBody::FillEstimateQuery: {
      const proto::FillSubmit& wire = r.body_type() == proto::ClientRequestBody::FillSubmit
                                          ? *r.body_as_FillSubmit()
                                          : *r.body_as_FillEstimateQuery()->job();
      auto parsed = frontend::ParseFill(wire);
      if (!parsed.ok()) break;
      CheckText(parsed->model, frontend::kMaxNameBytes, "fill model");
      CheckText(parsed->dataset_path, frontend::kMaxPathBytes, "dataset");
      CheckText(parsed->output_path, frontend::kMaxPathBytes, "output");
      CheckDuration(parsed->step, "fill step");
      CheckDuration(parsed->synthetic_step, "synthetic step");
      if (parsed->deadline) CheckDuration(*parsed->deadline, "fill deadline");
      break;
    }
    case proto::ClientRequestBody::RegisterBubbleCycle: {
      // A fixed clock: the origin arithmetic must hold for any origin_ns.
      const uint64_t now_ns = 1'000'000'000'000ull;
      const absl::Time now = absl::FromUnixSeconds(2'000'000'000);
      auto parsed = frontend::ParseCycle(*r.body_as_RegisterBubbleCycle(), now_ns, now);
      if (!parsed.ok()) break;
      if (parsed->origin) {
        PSWITCH_FUZZ_CHECK(*parsed->origin <= now && *parsed->origin > absl::InfinitePast(),
                           "a cycle origin after now or unbounded");
      }
      break;
    }
    case proto::ClientRequestBody::BubbleBegin: {
      const frontend::BubbleBeginRequest begin =
          frontend::ParseBubbleBegin(*r.body_as_BubbleBegin());
      CheckDuration(begin.expected, "bubble duration");
      break;
    }
    default:
      break;
  }
  return 0;
}
