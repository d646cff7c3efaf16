#include "pipeline/stage_compute.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/status.h"

namespace pswitch::pipeline {

absl::Status StageCompute::AddTiedGradient(const WireTensor&) {
  return absl::FailedPreconditionError("this stage holds no tied weight");
}

SimulatedCompute::SimulatedCompute(std::optional<StageCost> cost,
                                   std::unique_ptr<StageCompute> source, int64_t message_floats)
    : message_floats_(message_floats), cost_(cost), source_(std::move(source)) {}

std::unique_ptr<SimulatedCompute> SimulatedCompute::WithCost(const StageCost& cost,
                                                             int64_t message_floats) {
  return std::unique_ptr<SimulatedCompute>(new SimulatedCompute(cost, nullptr, message_floats));
}

std::unique_ptr<SimulatedCompute> SimulatedCompute::ProfiledFrom(
    std::unique_ptr<StageCompute> source, int64_t message_floats) {
  return std::unique_ptr<SimulatedCompute>(
      new SimulatedCompute(std::nullopt, std::move(source), message_floats));
}

TensorSpec SimulatedCompute::InputSpec() const { return {WireDType::kF32, {message_floats_}}; }

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
  WireTensor t{
      WireDType::kF32, {message_floats_}, std::vector<uint8_t>(message_floats_ * sizeof(float))};
  const float value = static_cast<float>(microbatch);
  for (int64_t i = 0; i < message_floats_; ++i) {
    std::memcpy(t.data.data() + i * sizeof(float), &value, sizeof(float));
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
