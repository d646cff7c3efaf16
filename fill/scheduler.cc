#include "fill/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fill/partition.h"
#include "base/status.h"

namespace pswitch::fill {
namespace {

bool IsFinite(absl::Time t) { return t != absl::InfinitePast() && t != absl::InfiniteFuture(); }

std::string StageLabel(const FillStage& stage, int index) {
  return stage.name.empty() ? absl::StrCat("stage ", index)
                            : absl::StrCat("stage '", stage.name, "'");
}

FillWork WorkOf(const FillJob& job, const FillStage& stage) {
  return FillWork{job.steps_left(), job.step_duration, job.memory_bytes, stage.switch_overhead};
}

}  // namespace

absl::StatusOr<std::unique_ptr<FillScheduler>> FillScheduler::Create(std::vector<FillStage> stages,
                                                                     FillSchedulerOptions options) {
  if (stages.empty()) return absl::InvalidArgumentError("fill scheduler: no stages");
  for (size_t i = 0; i < stages.size(); ++i) {
    const FillStage& stage = stages[i];
    const std::string label = StageLabel(stage, static_cast<int>(i));
    if (absl::Status status = ValidateBubbleCycle(stage.cycle); !status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("fill scheduler: ", label, ": ", status.message()));
    }
    if (stage.switch_overhead < absl::ZeroDuration() ||
        stage.switch_overhead == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("fill scheduler: ", label, ": switch_overhead must be finite and >= 0, got ",
                       absl::FormatDuration(stage.switch_overhead)));
    }
    if (!IsFinite(stage.cycle_origin)) {
      return absl::InvalidArgumentError(
          absl::StrCat("fill scheduler: ", label, ": cycle_origin must be a finite time"));
    }
  }
  return std::unique_ptr<FillScheduler>(new FillScheduler(std::move(stages), std::move(options)));
}

FillScheduler::FillScheduler(std::vector<FillStage> stages, FillSchedulerOptions options)
    : stages_(std::move(stages)),
      score_(options.custom_score ? std::move(options.custom_score)
                                  : ScoreFunctionFor(options.policy)),
      reject_missed_deadlines_(options.reject_missed_deadlines),
      queues_(stages_.size()) {}

absl::StatusOr<absl::Time> FillScheduler::PredictCompletion(int stage, const FillJob& job,
                                                            absl::Time start) const {
  const FillStage& s = stages_[stage];
  // Before the cycle origin the timeline has not begun; its first bubble is the earliest.
  const absl::Duration offset = std::max(start - s.cycle_origin, absl::ZeroDuration());
  PSWITCH_ASSIGN_OR_RETURN(const absl::Duration completion,
                           PredictFillCompletion(s.cycle, WorkOf(job, s), offset));
  return s.cycle_origin + completion;
}

absl::Time FillScheduler::CompletionOfPlaced(const PlacedJob& placed, absl::Time start) const {
  absl::StatusOr<absl::Time> completion = PredictCompletion(placed.stage, placed.job, start);
  // Cannot fail for a placed job: Submit checked that it fits its stage, and whether a job fits
  // does not depend on how many steps it has left. "Never" is still the honest fallback.
  return completion.ok() ? *completion : absl::InfiniteFuture();
}

absl::Duration FillScheduler::BusyTime(int stage, absl::Time now) const {
  const std::optional<uint64_t>& current = queues_[stage].current;
  if (!current.has_value()) return absl::ZeroDuration();
  return CompletionOfPlaced(jobs_.at(*current), now) - now;
}

std::vector<uint64_t> FillScheduler::RankedWaiting(int stage, absl::Time now) const {
  absl::Duration other_stages_busy = absl::ZeroDuration();
  for (int s = 0; s < num_stages(); ++s) {
    if (s != stage) other_stages_busy = std::max(other_stages_busy, BusyTime(s, now));
  }
  struct Ranked {
    double score;
    int64_t seq;
    uint64_t id;
  };
  std::vector<Ranked> ranked;
  for (uint64_t id : queues_[stage].waiting) {
    const PlacedJob& placed = jobs_.at(id);
    const ScoreInput input{placed.job, stage, now, CompletionOfPlaced(placed, now) - now,
                           other_stages_busy};
    double score = score_(input);
    // NaN would break the sort's ordering; a custom score that yields it ranks last.
    if (std::isnan(score)) score = -std::numeric_limits<double>::infinity();
    ranked.push_back({score, placed.seq, id});
  }
  std::sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    if (a.score != b.score) return a.score > b.score;
    return a.seq < b.seq;
  });
  std::vector<uint64_t> ids;
  ids.reserve(ranked.size());
  for (const Ranked& r : ranked) ids.push_back(r.id);
  return ids;
}

std::vector<FillScheduler::ChainEntry> FillScheduler::Chain(int stage, absl::Time now) const {
  std::vector<ChainEntry> chain;
  absl::Time t = now;
  auto append = [&](uint64_t id) {
    t = CompletionOfPlaced(jobs_.at(id), t);
    chain.push_back({id, t});
  };
  if (queues_[stage].current.has_value()) append(*queues_[stage].current);
  for (uint64_t id : RankedWaiting(stage, now)) append(id);
  return chain;
}

absl::StatusOr<int> FillScheduler::Place(const FillJob& job, absl::Time now) const {
  std::optional<int> best;
  absl::Time best_finish;
  size_t best_jobs = 0;
  std::vector<std::string> reasons;
  for (int s = 0; s < num_stages(); ++s) {
    if (absl::StatusOr<absl::Time> fits = PredictCompletion(s, job, now); !fits.ok()) {
      reasons.push_back(absl::StrCat(StageLabel(stages_[s], s), ": ", fits.status().message()));
      continue;
    }
    const std::vector<ChainEntry> chain = Chain(s, now);
    const absl::Time tail = chain.empty() ? now : chain.back().completion;
    const absl::StatusOr<absl::Time> finish = PredictCompletion(s, job, tail);
    if (!finish.ok()) continue;  // unreachable: it fit above, and fitting ignores the start
    if (!best.has_value() || *finish < best_finish ||
        (*finish == best_finish && chain.size() < best_jobs)) {
      best = s;
      best_finish = *finish;
      best_jobs = chain.size();
    }
  }
  if (!best.has_value()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "fill job ", job.id, " fits no stage's bubbles: ", absl::StrJoin(reasons, "; ")));
  }
  return *best;
}

absl::Status FillScheduler::CheckDeadlines(int stage, const std::vector<ChainEntry>& before,
                                           uint64_t new_job, absl::Time now) const {
  absl::flat_hash_map<uint64_t, absl::Time> completion_before;
  for (const ChainEntry& entry : before) completion_before[entry.job_id] = entry.completion;
  for (const ChainEntry& entry : Chain(stage, now)) {
    const std::optional<absl::Time>& deadline = jobs_.at(entry.job_id).job.deadline;
    if (!deadline.has_value() || entry.completion <= *deadline) continue;
    if (entry.job_id == new_job) {
      return absl::FailedPreconditionError(absl::StrCat(
          "fill job ", new_job, ": predicted completion ", absl::FormatTime(entry.completion),
          " on ", StageLabel(stages_[stage], stage), " is after its deadline ",
          absl::FormatTime(*deadline)));
    }
    // A job that was already going to miss its deadline does not block others.
    auto it = completion_before.find(entry.job_id);
    if (it != completion_before.end() && it->second <= *deadline) {
      return absl::FailedPreconditionError(
          absl::StrCat("fill job ", new_job, ": admitting it would make fill job ", entry.job_id,
                       " miss its deadline ", absl::FormatTime(*deadline)));
    }
  }
  return absl::OkStatus();
}

absl::Status FillScheduler::Submit(const FillJob& job, absl::Time now) {
  PSWITCH_RETURN_IF_ERROR(ValidateFillJob(job));
  if (!IsFinite(now)) return absl::InvalidArgumentError("fill scheduler: now must be finite");
  if (jobs_.contains(job.id)) {
    return absl::AlreadyExistsError(absl::StrCat("fill job ", job.id, " is already submitted"));
  }
  PSWITCH_ASSIGN_OR_RETURN(const int stage, Place(job, now));
  std::vector<ChainEntry> before;
  if (reject_missed_deadlines_) before = Chain(stage, now);
  jobs_[job.id] = PlacedJob{job, stage, next_seq_++};
  queues_[stage].waiting.push_back(job.id);
  if (reject_missed_deadlines_) {
    if (absl::Status status = CheckDeadlines(stage, before, job.id, now); !status.ok()) {
      Forget(job.id);
      return status;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<uint64_t>> FillScheduler::Next(int stage, absl::Time now) {
  if (stage < 0 || stage >= num_stages()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fill scheduler: stage ", stage, " out of range [0, ", num_stages(), ")"));
  }
  StageQueue& queue = queues_[stage];
  if (queue.current.has_value()) return queue.current;
  const std::vector<uint64_t> ranked = RankedWaiting(stage, now);
  if (ranked.empty()) return std::optional<uint64_t>();
  queue.current = ranked.front();
  queue.waiting.erase(std::find(queue.waiting.begin(), queue.waiting.end(), ranked.front()));
  return queue.current;
}

absl::Status FillScheduler::ReportProgress(uint64_t job_id, int64_t steps_done) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("fill job ", job_id, " is not scheduled"));
  }
  FillJob& job = it->second.job;
  if (steps_done < job.steps_done || steps_done > job.steps_total) {
    return absl::InvalidArgumentError(absl::StrCat("fill job ", job_id, ": steps_done ", steps_done,
                                                   " must be in [", job.steps_done, ", ",
                                                   job.steps_total, "]"));
  }
  job.steps_done = steps_done;
  if (job.steps_done == job.steps_total) Forget(job_id);
  return absl::OkStatus();
}

absl::Status FillScheduler::Remove(uint64_t job_id) {
  if (!jobs_.contains(job_id)) {
    return absl::NotFoundError(absl::StrCat("fill job ", job_id, " is not scheduled"));
  }
  Forget(job_id);
  return absl::OkStatus();
}

absl::StatusOr<FillEstimate> FillScheduler::Estimate(uint64_t job_id, absl::Time now) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("fill job ", job_id, " is not scheduled"));
  }
  const int stage = it->second.stage;
  for (const ChainEntry& entry : Chain(stage, now)) {
    if (entry.job_id != job_id) continue;
    const std::optional<absl::Time>& deadline = it->second.job.deadline;
    return FillEstimate{stage, entry.completion,
                        !deadline.has_value() || entry.completion <= *deadline};
  }
  return absl::InternalError(absl::StrCat("fill job ", job_id, " is missing from its stage"));
}

std::vector<uint64_t> FillScheduler::RunOrder(int stage, absl::Time now) const {
  std::vector<uint64_t> ids;
  if (stage < 0 || stage >= num_stages()) return ids;
  for (const ChainEntry& entry : Chain(stage, now)) ids.push_back(entry.job_id);
  return ids;
}

std::optional<int> FillScheduler::StageOf(uint64_t job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return std::nullopt;
  return it->second.stage;
}

absl::StatusOr<FillEstimate> FillScheduler::EstimateNew(const FillJob& job, absl::Time now) {
  const int64_t seq = next_seq_;
  PSWITCH_RETURN_IF_ERROR(Submit(job, now));
  absl::StatusOr<FillEstimate> estimate = Estimate(job.id, now);
  Forget(job.id);
  next_seq_ = seq;  // as if never submitted: tie-breaks between later jobs are unchanged
  return estimate;
}

void FillScheduler::Forget(uint64_t job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  StageQueue& queue = queues_[it->second.stage];
  if (queue.current == job_id) {
    queue.current.reset();
  } else {
    queue.waiting.erase(std::remove(queue.waiting.begin(), queue.waiting.end(), job_id),
                        queue.waiting.end());
  }
  jobs_.erase(it);
}

}  // namespace pswitch::fill
