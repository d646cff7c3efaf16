#include "pipeline/stage_runner.h"

#include <signal.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pipeline/internal/control.h"
#include "pipeline/link_reader.h"
#include "pipeline/simulator.h"
#include "base/status.h"

namespace pswitch::pipeline {
namespace {

constexpr uint64_t kMaxControlBytes = 1 << 20;

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

// Neighbours send exactly the tensors the specs describe, so anything larger is refused before
// it is read (and never above the configured cap).
uint64_t SpecBytes(const TensorSpec& spec) {
  uint64_t bytes = WireDTypeBytes(spec.dtype);
  for (int64_t d : spec.shape) bytes *= static_cast<uint64_t>(std::max<int64_t>(d, 0));
  return bytes;
}

class StageRunner {
 public:
  StageRunner(const StageConfig& config, StageLinks& links, StageCompute& compute,
              BubbleReporter& reporter)
      : config_(config),
        stage_(config.stage),
        last_(config.schedule.stages - 1),
        ops_(config.schedule.ops.at(config.stage)),
        links_(links),
        compute_(compute),
        reporter_(reporter) {}

  absl::Status Serve();

 private:
  absl::Status RunIteration(int iteration, absl::Time start, StageIterationStats* stats);
  absl::Status RunOp(int index, int iteration, absl::Time start, StageIterationStats* stats);
  absl::Status ExchangeTiedGradient(int iteration, absl::Time start, StageIterationStats* stats);
  // Takes the next message from `reader`, announcing a bubble when it has not arrived yet.
  absl::StatusOr<Message> Await(LinkReader& reader, int before_op, absl::Time start,
                                StageIterationStats* stats);
  absl::Status Send(const UniqueFd& fd, Message message, absl::string_view link);
  uint64_t PayloadLimit(const TensorSpec& spec) const {
    return std::min(SpecBytes(spec), config_.max_payload_bytes);
  }

  const StageConfig& config_;
  const int stage_;
  const int last_;
  const std::vector<Op>& ops_;
  StageLinks& links_;
  StageCompute& compute_;
  BubbleReporter& reporter_;

  std::unique_ptr<LinkReader> from_prev_, from_next_, from_tied_;
  std::optional<SimulatedIteration> plan_;
};

absl::Status StageRunner::Serve() {
  // Within one iteration a link carries at most one message per micro-batch, and no stage starts
  // the next iteration before every stage has finished this one.
  const size_t max_queued = static_cast<size_t>(config_.schedule.microbatches) + 2;
  if (links_.prev.valid()) {
    from_prev_ = std::make_unique<LinkReader>(links_.prev.get(),
                                              absl::StrCat("link from stage ", stage_ - 1),
                                              PayloadLimit(compute_.InputSpec()), max_queued);
  }
  if (links_.next.valid()) {
    from_next_ = std::make_unique<LinkReader>(links_.next.get(),
                                              absl::StrCat("link from stage ", stage_ + 1),
                                              PayloadLimit(compute_.OutputSpec()), max_queued);
  }
  if (links_.tied.valid()) {
    from_tied_ = std::make_unique<LinkReader>(links_.tied.get(), "tied-weight link",
                                              config_.max_payload_bytes, 2);
  }

  absl::Duration barrier_expected;
  bool at_barrier = false;
  while (true) {
    // Before the first iteration the coordinator is profiling other stages, which takes as
    // long as it takes; the coordinator bounds that and closes this socket on failure.
    const absl::Time deadline =
        at_barrier ? absl::Now() + config_.receive_timeout : absl::InfiniteFuture();
    if (at_barrier) {
      reporter_.BubbleBegin(stage_, BubbleReporter::kBarrierPosition, barrier_expected,
                            config_.bubble_free_bytes);
    }
    absl::StatusOr<Message> control =
        ReceiveMessage(links_.control.get(), kMaxControlBytes, deadline);
    if (at_barrier) reporter_.BubbleEnd(stage_);
    if (!control.ok()) return Annotate(control.status(), "control link");
    at_barrier = false;

    switch (control->kind) {
      case MessageKind::kProfile: {
        PSWITCH_ASSIGN_OR_RETURN(StageCost cost, compute_.Profile());
        PSWITCH_RETURN_IF_ERROR(
            Send(links_.control, TextMessage(MessageKind::kReady, 0, internal::EncodeCost(cost)),
                 "control link"));
        break;
      }
      case MessageKind::kPlan: {
        PSWITCH_ASSIGN_OR_RETURN(
            std::vector<StageCost> costs,
            internal::DecodePlan(MessageText(*control), config_.schedule.stages));
        PSWITCH_ASSIGN_OR_RETURN(plan_, Simulate(config_.schedule, costs));
        break;
      }
      case MessageKind::kStart: {
        if (!plan_) return absl::FailedPreconditionError("iteration started before the plan");
        if (control->iteration == config_.crash_at_iteration) ::raise(SIGKILL);
        PSWITCH_ASSIGN_OR_RETURN(absl::Time start, internal::DecodeStart(MessageText(*control)));
        reporter_.IterationStart(stage_, control->iteration);
        StageIterationStats stats;
        PSWITCH_RETURN_IF_ERROR(Annotate(RunIteration(control->iteration, start, &stats),
                                         absl::StrCat("iteration ", control->iteration)));
        PSWITCH_RETURN_IF_ERROR(
            Send(links_.control,
                 TextMessage(MessageKind::kDone, control->iteration, internal::EncodeStats(stats)),
                 "control link"));
        // The simulator's end-of-iteration idle, less what the tied exchange already waited.
        barrier_expected = plan_->stages[stage_].IdleBefore(static_cast<int>(ops_.size()));
        for (const MeasuredWait& w : stats.waits) {
          if (w.before_op == static_cast<int>(ops_.size())) barrier_expected -= w.duration;
        }
        barrier_expected = std::max(barrier_expected, absl::ZeroDuration());
        at_barrier = true;
        break;
      }
      case MessageKind::kStop:
        return absl::OkStatus();
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("control link: unexpected ", MessageKindName(control->kind), " message"));
    }
  }
}

absl::Status StageRunner::RunIteration(int iteration, absl::Time start,
                                       StageIterationStats* stats) {
  stats->stage = stage_;
  PSWITCH_RETURN_IF_ERROR(compute_.StartIteration(iteration));
  int in_flight = 0;
  for (size_t i = 0; i < ops_.size(); ++i) {
    PSWITCH_RETURN_IF_ERROR(
        Annotate(RunOp(static_cast<int>(i), iteration, start, stats), OpName(ops_[i])));
    in_flight += ops_[i].kind == OpKind::kForward ? 1 : -1;
    stats->peak_in_flight = std::max(stats->peak_in_flight, in_flight);
  }
  if (links_.tied.valid()) {
    PSWITCH_RETURN_IF_ERROR(ExchangeTiedGradient(iteration, start, stats));
  }
  const absl::Time step_start = absl::Now();
  PSWITCH_ASSIGN_OR_RETURN(stats->loss, compute_.FinishIteration());
  const absl::Time end = absl::Now();
  stats->step = end - step_start;
  stats->finish = end - start;
  return absl::OkStatus();
}

absl::Status StageRunner::RunOp(int index, int iteration, absl::Time start,
                                StageIterationStats* stats) {
  const Op& op = ops_[index];
  if (op.kind == OpKind::kForward) {
    WireTensor input;
    if (stage_ > 0) {
      PSWITCH_ASSIGN_OR_RETURN(Message m, Await(*from_prev_, index, start, stats));
      PSWITCH_RETURN_IF_ERROR(ExpectMessage(m, absl::StrCat("link from stage ", stage_ - 1),
                                            MessageKind::kActivation, iteration, op.microbatch,
                                            compute_.InputSpec()));
      input = std::move(m.tensor);
    }
    const absl::Time t = absl::Now();
    PSWITCH_ASSIGN_OR_RETURN(WireTensor output, compute_.Forward(op.microbatch, std::move(input)));
    stats->forward += absl::Now() - t;
    if (stage_ < last_) {
      return Send(links_.next,
                  Message{MessageKind::kActivation, iteration, op.microbatch, std::move(output)},
                  absl::StrCat("link to stage ", stage_ + 1));
    }
    return absl::OkStatus();
  }
  WireTensor output_grad;
  if (stage_ < last_) {
    PSWITCH_ASSIGN_OR_RETURN(Message m, Await(*from_next_, index, start, stats));
    PSWITCH_RETURN_IF_ERROR(ExpectMessage(m, absl::StrCat("link from stage ", stage_ + 1),
                                          MessageKind::kGradient, iteration, op.microbatch,
                                          compute_.OutputSpec()));
    output_grad = std::move(m.tensor);
  }
  const absl::Time t = absl::Now();
  PSWITCH_ASSIGN_OR_RETURN(WireTensor input_grad,
                           compute_.Backward(op.microbatch, std::move(output_grad)));
  stats->backward += absl::Now() - t;
  if (stage_ > 0) {
    return Send(links_.prev,
                Message{MessageKind::kGradient, iteration, op.microbatch, std::move(input_grad)},
                absl::StrCat("link to stage ", stage_ - 1));
  }
  return absl::OkStatus();
}

absl::Status StageRunner::ExchangeTiedGradient(int iteration, absl::Time start,
                                               StageIterationStats* stats) {
  PSWITCH_ASSIGN_OR_RETURN(std::optional<WireTensor> mine, compute_.TiedGradient());
  if (!mine) return absl::FailedPreconditionError("tied-weight link but no tied weight");
  const TensorSpec spec{mine->dtype, mine->shape};
  // Both ends send first: the peer's reader thread drains the socket, so neither blocks.
  PSWITCH_RETURN_IF_ERROR(Send(links_.tied,
                               Message{MessageKind::kTiedGradient, iteration, 0, *std::move(mine)},
                               "tied-weight link"));
  PSWITCH_ASSIGN_OR_RETURN(Message peer,
                           Await(*from_tied_, static_cast<int>(ops_.size()), start, stats));
  PSWITCH_RETURN_IF_ERROR(
      ExpectMessage(peer, "tied-weight link", MessageKind::kTiedGradient, iteration, 0, spec));
  return compute_.AddTiedGradient(peer.tensor);
}

absl::StatusOr<Message> StageRunner::Await(LinkReader& reader, int before_op, absl::Time start,
                                           StageIterationStats* stats) {
  if (reader.HasMessage()) return reader.Take(absl::ZeroDuration());
  const absl::Duration expected = plan_->stages[stage_].IdleBefore(before_op);
  const absl::Time begin = absl::Now();
  reporter_.BubbleBegin(stage_, before_op, expected, config_.bubble_free_bytes);
  absl::StatusOr<Message> message = reader.Take(config_.receive_timeout);
  const absl::Time end = absl::Now();
  reporter_.BubbleEnd(stage_);
  stats->waits.push_back({before_op, begin - start, end - begin, expected});
  return message;
}

absl::Status StageRunner::Send(const UniqueFd& fd, Message message, absl::string_view link) {
  return Annotate(SendMessage(fd.get(), message, absl::Now() + config_.receive_timeout), link);
}

}  // namespace

absl::Status ServeStage(const StageConfig& config, StageLinks& links, StageCompute& compute,
                        BubbleReporter& reporter) {
  if (config.stage < 0 || config.stage >= config.schedule.stages) {
    return absl::InvalidArgumentError(absl::StrCat("stage ", config.stage, " out of range"));
  }
  if ((config.stage > 0) != links.prev.valid() ||
      (config.stage < config.schedule.stages - 1) != links.next.valid() || !links.control.valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", config.stage, ": links do not match its place in the pipeline"));
  }
  StageRunner runner(config, links, compute, reporter);
  return Annotate(runner.Serve(), absl::StrCat("stage ", config.stage));
}

}  // namespace pswitch::pipeline
