#include "frontend/requests.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "api/client_codec.h"
#include "base/status.h"
#include "base/text.h"

namespace pswitch::frontend {
namespace {

// Keeps every Duration and deadline sum finite; a day-long bubble or step is not one.
constexpr uint64_t kMaxUs = 86400ull * 1000000;

// A client's string: UTF-8 without control characters, within `max_bytes` (never echoed).
absl::StatusOr<std::string> Text(const flatbuffers::String* s, absl::string_view what,
                                 size_t max_bytes) {
  std::string text = s != nullptr ? s->str() : "";
  PSWITCH_RETURN_IF_ERROR(base::CheckText(text, what, max_bytes));
  return text;
}

}  // namespace

absl::StatusOr<registry::ModelRequest> ParseRegistration(const proto::RegisterModel& wire) {
  registry::ModelRequest r;
  PSWITCH_ASSIGN_OR_RETURN(r.name, Text(wire.name(), "model name", kMaxNameBytes));
  PSWITCH_ASSIGN_OR_RETURN(r.zoo_model, Text(wire.zoo_model(), "architecture", kMaxNameBytes));
  PSWITCH_ASSIGN_OR_RETURN(r.weights_path,
                           Text(wire.weights_path(), "weights path", kMaxPathBytes));
  PSWITCH_ASSIGN_OR_RETURN(r.plan, Text(wire.plan_path(), "plan path", kMaxPathBytes));
  PSWITCH_ASSIGN_OR_RETURN(r.archive_path,
                           Text(wire.archive_path(), "archive path", kMaxPathBytes));
  if (r.plan.empty()) r.plan = "auto";
  PSWITCH_ASSIGN_OR_RETURN(r.dtype, Text(wire.dtype(), "dtype", kMaxNameBytes));
  r.batch_size = wire.batch_size();
  r.pin_resident = wire.pin_resident();
  if (wire.trainers() != nullptr) {
    if (wire.trainers()->size() > kMaxTrainers) {
      return absl::InvalidArgumentError(
          absl::StrCat("a model names at most ", kMaxTrainers, " trainers"));
    }
    for (const flatbuffers::String* trainer : *wire.trainers()) {
      PSWITCH_ASSIGN_OR_RETURN(std::string name, Text(trainer, "trainer name", kMaxNameBytes));
      if (name.empty()) return absl::InvalidArgumentError("a trainer name must not be empty");
      r.trainers.push_back(std::move(name));
    }
  }
  if (absl::StartsWith(r.name, kFillModelPrefix)) {
    return absl::InvalidArgumentError(absl::StrCat("model names starting with '", kFillModelPrefix,
                                                   "' are reserved for fill jobs' own models"));
  }
  return r;
}

absl::Status CheckUnloadName(const std::string& name) {
  PSWITCH_RETURN_IF_ERROR(base::CheckText(name, "model name", kMaxNameBytes));
  if (name.empty()) return absl::InvalidArgumentError("model name must not be empty");
  return absl::OkStatus();
}

absl::StatusOr<std::string> ParseUnload(const proto::UnloadModel& wire) {
  PSWITCH_ASSIGN_OR_RETURN(std::string name, Text(wire.name(), "model name", kMaxNameBytes));
  PSWITCH_RETURN_IF_ERROR(CheckUnloadName(name));
  return name;
}

absl::StatusOr<absl::Duration> ParseOnlineObjective(uint64_t objective_us, TaskKind kind) {
  if (kind != TaskKind::kInference) {
    return absl::InvalidArgumentError(
        "only an inference request may carry a latency objective (online fill)");
  }
  const absl::Duration objective =
      absl::Microseconds(static_cast<int64_t>(std::min<uint64_t>(objective_us, uint64_t{1} << 50)));
  if (objective_us == 0 || objective > controller::kMaxOnlineObjective) {
    return absl::InvalidArgumentError(
        absl::StrCat("a latency objective must be in (0, ",
                     absl::FormatDuration(controller::kMaxOnlineObjective), "]"));
  }
  return objective;
}

absl::StatusOr<ParsedTask> ParseTask(const proto::SubmitTask& wire, absl::Time now) {
  ParsedTask parsed;
  controller::TaskSpec& spec = parsed.spec;
  PSWITCH_ASSIGN_OR_RETURN(spec.model, Text(wire.model(), "model name", kMaxNameBytes));
  switch (wire.kind()) {
    case proto::TaskKind::Inference:
      spec.kind = TaskKind::kInference;
      break;
    case proto::TaskKind::Training:
      spec.kind = TaskKind::kTraining;
      break;
    default:  // an unknown kind once ran as inference
      return absl::InvalidArgumentError(
          absl::StrCat("unknown task kind ", static_cast<int>(wire.kind())));
  }
  if (wire.optimizer() != proto::Optimizer::Sgd && wire.optimizer() != proto::Optimizer::Adam) {
    return absl::InvalidArgumentError("unknown optimizer");
  }
  if (wire.inputs() != nullptr) {
    if (wire.inputs()->size() > kMaxInputTensors) {
      return absl::InvalidArgumentError(
          absl::StrCat("a task takes at most ", kMaxInputTensors, " input tensors"));
    }
    // Checked before anything can quote them in an error.
    for (const proto::Tensor* t : *wire.inputs()) {
      PSWITCH_RETURN_IF_ERROR(Text(t->name(), "input tensor name", kMaxNameBytes).status());
    }
  }
  PSWITCH_ASSIGN_OR_RETURN(spec.inputs, proto::FromWireTensors(wire.inputs()));
  spec.iterations = wire.iterations();
  spec.batch = wire.batch_size();
  spec.seed = wire.seed();
  const bool adam = wire.optimizer() == proto::Optimizer::Adam;
  spec.trainer.optimizer = adam ? api::OptimizerKind::kAdam : api::OptimizerKind::kSgd;
  spec.trainer.learning_rate = wire.learning_rate();
  spec.trainer.momentum = adam ? 0 : wire.momentum();
  spec.priority = wire.priority();
  if (wire.deadline_ms() > 0) {
    spec.deadline = now + absl::Milliseconds(static_cast<int64_t>(std::min<uint64_t>(
                              wire.deadline_ms(), kMaxUs / 1000)));  // the server's is shorter
  }
  PSWITCH_ASSIGN_OR_RETURN(parsed.as_model, Text(wire.as_model(), "copy name", kMaxNameBytes));
  if (!parsed.as_model.empty() && spec.kind != TaskKind::kTraining) {
    return absl::InvalidArgumentError("only a training task trains a copy (as_model)");
  }
  const proto::Place place = wire.outputs_place();
  proto::ByteSlice to;
  if (const proto::Slice* slice = wire.outputs_to(); slice != nullptr) {
    to = proto::ByteSlice{slice->region(), slice->offset(), slice->length()};
  }
  switch (place) {
    case proto::Place::Inline:
      if (to != proto::ByteSlice{}) {
        return absl::InvalidArgumentError("outputs_to is given but outputs_place is Inline");
      }
      break;
    case proto::Place::Region:
      if (to.region == 0 || to.length == 0) {
        return absl::InvalidArgumentError(
            "outputs_place Region needs outputs_to: a region id and a length");
      }
      if (to.offset > UINT64_MAX - to.length) {
        return absl::InvalidArgumentError("outputs_to: offset + length overflows");
      }
      spec.outputs_to = to;
      break;
    case proto::Place::Payload:
      parsed.outputs_in_payload = true;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown outputs_place ", static_cast<int>(place)));
  }
  if (spec.kind == TaskKind::kTraining && place != proto::Place::Inline) {
    return absl::InvalidArgumentError("a training task has no outputs to place");
  }
  if (wire.online_slo_us() > 0) {
    PSWITCH_ASSIGN_OR_RETURN(spec.online_slo,
                             ParseOnlineObjective(wire.online_slo_us(), spec.kind));
  }
  if (!parsed.as_model.empty() && absl::StartsWith(parsed.as_model, kFillModelPrefix)) {
    return absl::InvalidArgumentError(absl::StrCat("model names starting with '", kFillModelPrefix,
                                                   "' are reserved for fill jobs' own models"));
  }
  return parsed;
}

absl::StatusOr<FillRequest> ParseFill(const proto::FillSubmit& wire) {
  FillRequest r;
  PSWITCH_ASSIGN_OR_RETURN(r.kind, api::FromWire(wire.kind()));
  if (wire.step_us() > kMaxUs || wire.synthetic_step_us() > kMaxUs ||
      wire.deadline_ms() > kMaxUs / 1000) {
    return absl::InvalidArgumentError("fill job durations must be under a day");
  }
  PSWITCH_ASSIGN_OR_RETURN(r.model, Text(wire.model(), "model name", kMaxNameBytes));
  PSWITCH_ASSIGN_OR_RETURN(r.dataset_path, Text(wire.dataset_path(), "dataset", kMaxPathBytes));
  PSWITCH_ASSIGN_OR_RETURN(r.output_path, Text(wire.output_path(), "output", kMaxPathBytes));
  r.batch = wire.batch();
  r.steps = wire.steps();
  r.seed = wire.seed();
  r.step = absl::Microseconds(static_cast<int64_t>(wire.step_us()));
  r.memory_bytes = wire.memory_bytes();
  if (wire.deadline_ms() > 0) {
    r.deadline = absl::Milliseconds(static_cast<int64_t>(wire.deadline_ms()));
  }
  r.synthetic_step = absl::Microseconds(static_cast<int64_t>(wire.synthetic_step_us()));
  r.synthetic_alloc_bytes = wire.synthetic_alloc_bytes();
  r.ignore_pause = wire.test_only_ignore_pause();
  return r;
}

absl::StatusOr<CycleRequest> ParseCycle(const proto::RegisterBubbleCycle& wire, uint64_t now_ns,
                                        absl::Time now) {
  CycleRequest r;
  r.gpu = static_cast<int>(wire.gpu());
  if (wire.cycle_json() == nullptr) {  // optional in the schema: once dereferenced regardless
    return absl::InvalidArgumentError("a bubble cycle needs its cycle JSON");
  }
  PSWITCH_ASSIGN_OR_RETURN(r.cycle, fill::ParseBubbleCycleJson(wire.cycle_json()->str()));
  if (wire.origin_ns() != 0) {
    // The main job runs on this node: its monotonic clock is ours.
    if (wire.origin_ns() > now_ns) {
      return absl::InvalidArgumentError(
          absl::StrCat("bubble cycle origin_ns ", wire.origin_ns(),
                       " is in the future (CLOCK_MONOTONIC now: ", now_ns, ")"));
    }
    const uint64_t age_ns = now_ns - wire.origin_ns();
    if (age_ns > kMaxUs * 1000 * 365) {
      return absl::InvalidArgumentError("bubble cycle origin_ns is over a year old");
    }
    r.origin = now - absl::Nanoseconds(static_cast<int64_t>(age_ns));
  }
  return r;
}

BubbleBeginRequest ParseBubbleBegin(const proto::BubbleBegin& wire) {
  BubbleBeginRequest r;
  r.gpu = static_cast<int>(wire.gpu());
  // Bounded so the deadline arithmetic cannot overflow.
  r.expected = absl::Microseconds(
      static_cast<int64_t>(std::min<uint64_t>(wire.expected_duration_us(), kMaxUs)));
  r.free_bytes = wire.free_bytes();
  r.began_ns = wire.began_ns();
  return r;
}

}  // namespace pswitch::frontend
