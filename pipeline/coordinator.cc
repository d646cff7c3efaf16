#include "pipeline/coordinator.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pipeline/internal/control.h"
#include "pipeline/internal/stage_group.h"
#include "pipeline/wire.h"
#include "base/status.h"

namespace pswitch::pipeline {
namespace {

constexpr uint64_t kMaxControlBytes = 1 << 20;
// How long the other stages get to report after the first failure: long enough for a
// neighbour's "peer closed" to arrive, short enough not to delay the error.
constexpr absl::Duration kFailureDrain = absl::Seconds(2);
constexpr absl::Duration kExitGrace = absl::Seconds(10);

absl::StatusOr<std::pair<UniqueFd, UniqueFd>> SocketPair(absl::string_view what) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoStatus(absl::StrCat("socketpair for ", what));
  }
  return std::make_pair(UniqueFd(sv[0]), UniqueFd(sv[1]));
}

absl::Status ValidateOptions(const PipelineOptions& o) {
  if (o.iterations < 1) return absl::InvalidArgumentError("iterations must be at least 1");
  if (o.warmup < 0) return absl::InvalidArgumentError("warm-up iterations must be >= 0");
  if (o.receive_timeout <= absl::ZeroDuration() || o.setup_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeouts must be positive");
  }
  if (o.tied_link && o.stages < 2) {
    return absl::InvalidArgumentError("a tied-weight link needs at least 2 stages");
  }
  return absl::OkStatus();
}

// Drives the stages over their control sockets. Owns the coordinator's ends of those sockets;
// borrows the group, which must outlive it.
class Coordinator {
 public:
  Coordinator(const PipelineOptions& options, Schedule schedule, std::vector<UniqueFd> control,
              internal::StageGroup& group)
      : options_(options),
        schedule_(std::move(schedule)),
        control_(std::move(control)),
        group_(group) {}

  absl::StatusOr<PipelineReport> Run();

 private:
  struct Received {
    Message message;
    absl::Time at;
  };
  // One `kind` message for `iteration` from every stage in `from`, by stage. Any other message,
  // error report or closed socket fails the run (see Fail).
  absl::StatusOr<std::map<int, Received>> Collect(const std::vector<int>& from, MessageKind kind,
                                                  int iteration, absl::Duration timeout,
                                                  absl::string_view what);
  absl::Status SendTo(int stage, const Message& message);
  absl::Status Broadcast(const Message& message);
  absl::Status StopAll();
  absl::StatusOr<IterationStats> RunIteration(int iteration, absl::Duration predicted);
  // Ends the run after `first` went wrong on `stage` (-1: no single stage): collects the other
  // stages' reports, ends every stage, and returns an error naming the root cause first.
  absl::Status Fail(int stage, absl::Status first);

  const PipelineOptions& options_;
  const Schedule schedule_;
  std::vector<UniqueFd> control_;  // coordinator ends; invalid once the stage's end closed
  internal::StageGroup& group_;
  std::map<int, absl::Status> reported_;  // error reports received, by stage
};

absl::Status Coordinator::SendTo(int stage, const Message& message) {
  absl::Status sent =
      SendMessage(control_[stage].get(), message, absl::Now() + options_.receive_timeout);
  if (!sent.ok()) {
    return Fail(stage,
                absl::Status(sent.code(), absl::StrCat("control link to ", group_.Name(stage), ": ",
                                                       sent.message())));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::Broadcast(const Message& message) {
  for (int s = 0; s < schedule_.stages; ++s) PSWITCH_RETURN_IF_ERROR(SendTo(s, message));
  return absl::OkStatus();
}

absl::StatusOr<std::map<int, Coordinator::Received>> Coordinator::Collect(
    const std::vector<int>& from, MessageKind kind, int iteration, absl::Duration timeout,
    absl::string_view what) {
  const absl::Time deadline = absl::Now() + timeout;
  std::map<int, Received> got;
  while (got.size() < from.size()) {
    std::vector<pollfd> fds;
    std::vector<int> stage_of;
    for (int s = 0; s < schedule_.stages; ++s) {
      if (!control_[s].valid()) continue;
      fds.push_back({control_[s].get(), POLLIN, 0});
      stage_of.push_back(s);
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      std::vector<std::string> missing;
      for (int s : from) {
        if (!got.count(s)) missing.push_back(absl::StrCat(s));
      }
      return Fail(-1, absl::DeadlineExceededError(absl::StrCat(
                          "stage(s) ", absl::StrJoin(missing, ", "), " did not finish ", what,
                          " within ", absl::FormatDuration(timeout))));
    }
    const int r =
        ::poll(fds.data(), fds.size(), static_cast<int>(absl::ToInt64Milliseconds(left) + 1));
    if (r < 0 && errno != EINTR) return Fail(-1, ErrnoStatus("poll control links"));
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int s = stage_of[i];
      // A stage writes each control message whole; a bounded wait covers a slow tail.
      absl::StatusOr<Message> m =
          ReceiveMessage(control_[s].get(), kMaxControlBytes, absl::Now() + absl::Seconds(5));
      if (!m.ok()) {
        control_[s].Reset();
        return Fail(s, absl::Status(m.status().code(),
                                    absl::StrCat("control link: ", m.status().message())));
      }
      if (m->kind == MessageKind::kError) {
        reported_[s] = internal::DecodeError(MessageText(*m));
        return Fail(s, reported_[s]);
      }
      const bool wanted = std::find(from.begin(), from.end(), s) != from.end();
      if (!wanted || got.count(s) || m->kind != kind || m->iteration != iteration) {
        return Fail(s, absl::InternalError(absl::StrCat("unexpected ", MessageKindName(m->kind),
                                                        " message for iteration ", m->iteration,
                                                        " while waiting for ", what)));
      }
      got[s] = {*std::move(m), absl::Now()};
    }
  }
  return got;
}

absl::StatusOr<IterationStats> Coordinator::RunIteration(int iteration, absl::Duration predicted) {
  std::vector<int> all(schedule_.stages);
  for (int s = 0; s < schedule_.stages; ++s) all[s] = s;
  const absl::Time start = absl::Now();
  PSWITCH_RETURN_IF_ERROR(
      Broadcast(TextMessage(MessageKind::kStart, iteration, internal::EncodeStart(start))));
  PSWITCH_ASSIGN_OR_RETURN(auto done, Collect(all, MessageKind::kDone, iteration,
                                              options_.receive_timeout + 2 * predicted,
                                              absl::StrCat("iteration ", iteration)));
  IterationStats it;
  it.iteration = iteration;
  it.warmup = iteration < options_.warmup;
  absl::Time last = start;
  for (const auto& [s, received] : done) last = std::max(last, received.at);
  it.wall = last - start;
  for (int s = 0; s < schedule_.stages; ++s) {
    absl::StatusOr<StageIterationStats> stats = internal::DecodeStats(MessageText(done[s].message));
    if (!stats.ok() || stats->stage != s) {
      return Fail(s, absl::InternalError(absl::StrCat(
                         "bad measurements for iteration ", iteration, ": ",
                         stats.ok() ? "wrong stage" : std::string(stats.status().message()))));
    }
    stats->tail = std::max(absl::ZeroDuration(), it.wall - stats->finish);
    it.stages.push_back(*std::move(stats));
  }
  it.loss = it.stages.back().loss;
  return it;
}

absl::StatusOr<PipelineReport> Coordinator::Run() {
  PipelineReport report;
  report.schedule = schedule_.kind;
  report.stages = schedule_.stages;
  report.microbatches = schedule_.microbatches;
  // One stage at a time, so profiling runs do not compete for the cores.
  for (int s = 0; s < schedule_.stages; ++s) {
    PSWITCH_RETURN_IF_ERROR(SendTo(s, TextMessage(MessageKind::kProfile, 0, "")));
    PSWITCH_ASSIGN_OR_RETURN(auto ready,
                             Collect({s}, MessageKind::kReady, 0, options_.setup_timeout,
                                     absl::StrCat("setup and profiling of stage ", s)));
    absl::StatusOr<StageCost> cost = internal::DecodeCost(MessageText(ready[s].message));
    if (!cost.ok()) return Fail(s, cost.status());
    report.costs.push_back(*cost);
  }
  absl::StatusOr<SimulatedIteration> predicted = Simulate(schedule_, report.costs);
  if (!predicted.ok()) return Fail(-1, predicted.status());
  report.predicted = *std::move(predicted);
  PSWITCH_RETURN_IF_ERROR(
      Broadcast(TextMessage(MessageKind::kPlan, 0, internal::EncodePlan(report.costs))));
  for (int i = 0; i < options_.warmup + options_.iterations; ++i) {
    PSWITCH_ASSIGN_OR_RETURN(IterationStats it, RunIteration(i, report.predicted.iteration));
    report.iterations.push_back(std::move(it));
  }
  PSWITCH_RETURN_IF_ERROR(StopAll());
  return report;
}

absl::Status Coordinator::StopAll() {
  PSWITCH_RETURN_IF_ERROR(Broadcast(TextMessage(MessageKind::kStop, 0, "")));
  group_.Wait(absl::Now() + kExitGrace);
  for (int s = 0; s < schedule_.stages; ++s) {
    if (!group_.Ended(s)) {
      return Fail(s, absl::DeadlineExceededError(absl::StrCat("did not exit within ",
                                                              absl::FormatDuration(kExitGrace),
                                                              " of the stop message")));
    }
    if (!group_.EndedCleanly(s)) {
      return Fail(s, absl::InternalError(
                         absl::StrCat("ended badly after the stop message: ", group_.Outcome(s))));
    }
  }
  return absl::OkStatus();
}

absl::Status Coordinator::Fail(int stage, absl::Status first) {
  // Stages waiting for their next control message end at once (end-of-file); the others get a
  // moment to report: after a crash, its neighbours fail on the closed links.
  for (UniqueFd& fd : control_) {
    if (fd.valid()) ::shutdown(fd.get(), SHUT_WR);
  }
  const absl::Time drain_until = absl::Now() + kFailureDrain;
  while (absl::Now() < drain_until) {
    std::vector<pollfd> fds;
    std::vector<int> stage_of;
    for (int s = 0; s < schedule_.stages; ++s) {
      if (!control_[s].valid()) continue;
      fds.push_back({control_[s].get(), POLLIN, 0});
      stage_of.push_back(s);
    }
    if (fds.empty()) break;
    const int timeout_ms =
        static_cast<int>(absl::ToInt64Milliseconds(drain_until - absl::Now()) + 1);
    if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int s = stage_of[i];
      absl::StatusOr<Message> m =
          ReceiveMessage(control_[s].get(), kMaxControlBytes, absl::Now() + absl::Seconds(1));
      if (!m.ok()) {
        control_[s].Reset();
      } else if (m->kind == MessageKind::kError) {
        reported_[s] = internal::DecodeError(MessageText(*m));
      }
    }
  }
  // Threads waiting on their control socket end with end-of-file; processes are killed.
  for (UniqueFd& fd : control_) {
    if (fd.valid()) ::shutdown(fd.get(), SHUT_RDWR);
  }
  group_.Wait(absl::Now());  // reap what ended by itself, before killing marks the rest
  group_.KillRemaining();
  group_.Wait(absl::Now() + options_.receive_timeout + kExitGrace);

  // The root cause: a stage that crashed, else one whose error is not a consequence of another
  // stage's failure (a closed link or a timeout), else the first failure seen.
  auto consequential = [](const absl::Status& s) {
    return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDataLoss ||
           s.code() == absl::StatusCode::kDeadlineExceeded;
  };
  int root = -1;
  for (int s = 0; s < schedule_.stages && root < 0; ++s) {
    if (group_.Crashed(s) && !reported_.count(s)) root = s;
  }
  for (const auto& [s, status] : reported_) {
    if (root < 0 && !consequential(status)) root = s;
  }
  if (root < 0) root = stage;

  auto describe = [&](int s) {
    if (reported_.count(s)) return absl::StrCat(group_.Name(s), ": ", reported_[s].ToString());
    if (group_.Crashed(s) || !group_.EndedCleanly(s)) {
      return absl::StrCat(group_.Name(s), " ", group_.Outcome(s));
    }
    return absl::StrCat(group_.Name(s), " ended");
  };
  std::string message;
  absl::StatusCode code = first.code();
  if (root >= 0) {
    message = describe(root);
    if (group_.Crashed(root) && !reported_.count(root)) {
      code = absl::StatusCode::kAborted;
    } else if (reported_.count(root)) {
      code = reported_[root].code();
    } else if (root == stage) {
      absl::StrAppend(&message, ": ", first.message());  // e.g. a protocol error it caused
    }
  } else {
    message = std::string(first.message());
  }
  std::vector<std::string> others;
  for (int s = 0; s < schedule_.stages; ++s) {
    // Stages that only saw the coordinator hang up add nothing.
    const bool hung_up = reported_.count(s) &&
                         reported_[s].code() == absl::StatusCode::kUnavailable &&
                         absl::StrContains(reported_[s].message(), "control link");
    if (s != root && reported_.count(s) && !hung_up) others.push_back(describe(s));
  }
  if (!others.empty()) absl::StrAppend(&message, "; then ", absl::StrJoin(others, "; "));
  return absl::Status(code, absl::StrCat("pipeline failed: ", message));
}

}  // namespace

absl::StatusOr<PipelineReport> RunPipeline(const PipelineOptions& options,
                                           const StageMain& stage_main) {
  PSWITCH_RETURN_IF_ERROR(ValidateOptions(options));
  PSWITCH_ASSIGN_OR_RETURN(Schedule schedule,
                           BuildSchedule(options.schedule, options.stages, options.microbatches));
  const int S = schedule.stages;
  std::vector<StageLinks> links(S);
  std::vector<UniqueFd> control(S);
  for (int s = 0; s < S; ++s) {
    PSWITCH_ASSIGN_OR_RETURN(auto pair, SocketPair(absl::StrCat("stage ", s, " control")));
    control[s] = std::move(pair.first);
    links[s].control = std::move(pair.second);
  }
  for (int s = 0; s + 1 < S; ++s) {
    PSWITCH_ASSIGN_OR_RETURN(auto pair, SocketPair(absl::StrCat("stages ", s, "-", s + 1)));
    links[s].next = std::move(pair.first);
    links[s + 1].prev = std::move(pair.second);
  }
  if (options.tied_link) {
    PSWITCH_ASSIGN_OR_RETURN(auto pair, SocketPair("tied weights"));
    links[0].tied = std::move(pair.first);
    links[S - 1].tied = std::move(pair.second);
  }
  std::vector<StageConfig> configs(S);
  for (int s = 0; s < S; ++s) {
    configs[s].stage = s;
    configs[s].schedule = schedule;
    configs[s].receive_timeout = options.receive_timeout;
  }
  PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<internal::StageGroup> group,
                           internal::StageGroup::Launch(options.launch, std::move(configs),
                                                        std::move(links), stage_main));
  // Declared after the group so it is destroyed first: its sockets close before the group
  // joins (threads) or reaps (processes) the stages.
  Coordinator coordinator(options, std::move(schedule), std::move(control), *group);
  return coordinator.Run();
}

}  // namespace pswitch::pipeline
