#include "pipeline/stage_compute.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status.h"

namespace pswitch::pipeline {

absl::Status StageCompute::AddTiedGradient(const WireTensor&) {
  return absl::FailedPreconditionError("this stage holds no tied weight");
}

SimulatedCompute::SimulatedCompute(std::optional<StageCost> cost,
                                   std::unique_ptr<StageCompute> source, TensorSpec message)
    : message_(std::move(message)), cost_(cost), source_(std::move(source)) {}

std::unique_ptr<SimulatedCompute> SimulatedCompute::WithCost(const StageCost& cost,
                                                             TensorSpec message) {
  return std::unique_ptr<SimulatedCompute>(
      new SimulatedCompute(cost, nullptr, std::move(message)));
}

std::unique_ptr<SimulatedCompute> SimulatedCompute::ProfiledFrom(
    std::unique_ptr<StageCompute> source, TensorSpec message) {
  return std::unique_ptr<SimulatedCompute>(
      new SimulatedCompute(std::nullopt, std::move(source), std::move(message)));
}

absl::StatusOr<StageCost> SimulatedCompute::Profile() {
  if (!cost_) {
    if (source_ == nullptr) return absl::FailedPreconditionError("no cost and no source");
    PSWITCH_ASSIGN_OR_RETURN(StageCost measured, source_->Profile());
    cost_ = measured;
    source_.reset();  // the real stage's memory is not needed while simulating
  }
  return *cost_;
}

absl::Status SimulatedCompute::StartIteration(int) {
  if (!cost_) return absl::FailedPreconditionError("simulated stage used before Profile()");
  return absl::OkStatus();
}

WireTensor SimulatedCompute::Message(int microbatch) const {
  int64_t elements = 1;
  for (int64_t d : message_.shape) elements *= d;
  WireTensor t{message_.dtype, message_.shape,
               std::vector<uint8_t>(static_cast<size_t>(elements) * WireDTypeBytes(message_.dtype))};
  // f32 messages carry the micro-batch index, so a test can see which one arrived.
  if (message_.dtype == WireDType::kF32) {
    const float value = static_cast<float>(microbatch);
    for (int64_t i = 0; i < elements; ++i) {
      std::memcpy(t.data.data() + i * sizeof(float), &value, sizeof(float));
    }
  }
  return t;
}

absl::StatusOr<WireTensor> SimulatedCompute::Forward(int microbatch, WireTensor) {
  absl::SleepFor(cost_->forward);
  return Message(microbatch);
}

absl::StatusOr<WireTensor> SimulatedCompute::Backward(int microbatch, WireTensor) {
  absl::SleepFor(cost_->backward);
  return Message(microbatch);
}

absl::StatusOr<double> SimulatedCompute::FinishIteration() {
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace pswitch::pipeline
