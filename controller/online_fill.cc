#include "controller/online_fill.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/log.h"

namespace pswitch::controller {

namespace {

// Weight of a new measurement in the smoothed service time: a few runs follow a change, one
// descheduled run does not swing it.
constexpr double kSmoothing = 0.25;

absl::Duration Ns(int64_t ns) { return absl::Nanoseconds(ns); }

// What a pass of a resident model costs on its GPU: its run from placement to answer, less the
// copy of its weights when they had to come in (a first, cold run must not make every later
// request look too long for its objective, and so never run again to correct it). Without a
// timeline (the scheduler did not place it): submission to answer.
int64_t ServiceNs(const TaskOutcome& outcome, int64_t submitted_ns) {
  const SwitchTimeline& t = outcome.timeline;
  if (t.placed_ns > 0 && t.result_ns > t.placed_ns) {
    if (outcome.switch_time == absl::ZeroDuration() || t.first_layer_start_ns == 0) {
      return t.result_ns - t.placed_ns;
    }
    // Cold: from its first layer's start (the copy overlaps what comes before), which is what
    // later, warm runs repeat.
    return t.result_ns - std::max(t.placed_ns, t.first_layer_start_ns);
  }
  return base::MonotonicNowNs() - submitted_ns;
}

}  // namespace

absl::StatusOr<OnlineOverflow> ParseOnlineOverflow(absl::string_view text) {
  if (text == "run") return OnlineOverflow::kRun;
  if (text == "refuse") return OnlineOverflow::kRefuse;
  return absl::InvalidArgumentError("--online-fill-overflow must be 'run' or 'refuse'");
}

const char* OnlineOverflowName(OnlineOverflow overflow) {
  return overflow == OnlineOverflow::kRun ? "run" : "refuse";
}

bool MayBatch(const TaskSpec& a, const TaskSpec& b) {
  auto plain = [](const TaskSpec& s) {
    return s.kind == TaskKind::kInference && s.regions.empty() && !s.outputs_to &&
           s.inputs_arrival == nullptr && !s.fill && !s.inputs.empty() &&
           std::all_of(s.inputs.begin(), s.inputs.end(), [](const proto::HostTensor& t) {
             return t.place == proto::Place::Inline && !t.shape.empty() && t.shape[0] > 0;
           });
  };
  if (a.model != b.model || a.principal != b.principal || a.principal.empty() || !plain(a) ||
      !plain(b) || a.inputs.size() != b.inputs.size()) {
    return false;
  }
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    const proto::HostTensor& x = a.inputs[i];
    const proto::HostTensor& y = b.inputs[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape.size() != y.shape.size() ||
        !std::equal(x.shape.begin() + 1, x.shape.end(), y.shape.begin() + 1)) {
      return false;
    }
  }
  // Every input of a request has the same rows (the batch), or they would not line up.
  auto one_batch = [](const TaskSpec& s) {
    return std::all_of(s.inputs.begin(), s.inputs.end(), [&s](const proto::HostTensor& t) {
      return t.shape[0] == s.inputs[0].shape[0];
    });
  };
  return one_batch(a) && one_batch(b);
}

TaskSpec MergeBatch(const std::vector<const TaskSpec*>& specs) {
  TaskSpec merged = *specs[0];
  for (size_t i = 0; i < merged.inputs.size(); ++i) {
    proto::HostTensor& t = merged.inputs[i];
    size_t bytes = 0;
    for (const TaskSpec* s : specs) bytes += s->inputs[i].data.size();
    t.data.clear();
    t.data.reserve(bytes);
    t.shape[0] = 0;
    for (const TaskSpec* s : specs) {
      t.data.insert(t.data.end(), s->inputs[i].data.begin(), s->inputs[i].data.end());
      t.shape[0] += s->inputs[i].shape[0];
    }
  }
  // The latest deadline: a member's own sooner one was kept while it waited (its queue
  // deadline), and one member's must not fail the others' rows.
  for (const TaskSpec* s : specs) {
    merged.deadline = std::max(merged.deadline, s->deadline);
    merged.priority = std::max(merged.priority, s->priority);
  }
  merged.online_slo.reset();
  return merged;
}

absl::StatusOr<std::vector<TaskOutcome>> SplitBatch(TaskOutcome outcome,
                                                    const std::vector<int64_t>& rows) {
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  // Everything but the outputs goes to every part; the outputs are cut below.
  const std::vector<proto::HostTensor> outputs = std::move(outcome.outputs);
  outcome.outputs.clear();
  std::vector<TaskOutcome> parts(rows.size(), outcome);
  for (const proto::HostTensor& t : outputs) {
    if (t.place != proto::Place::Inline || t.shape.empty() || t.shape[0] != total) {
      return absl::InvalidArgumentError(
          absl::StrCat("output '", t.name, "' is not one row per input row"));
    }
    const size_t row_bytes = t.data.size() / static_cast<size_t>(total);
    size_t at = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      proto::HostTensor part;
      part.name = t.name;
      part.dtype = t.dtype;
      part.shape = t.shape;
      part.shape[0] = rows[i];
      const size_t bytes = row_bytes * static_cast<size_t>(rows[i]);
      part.data.assign(t.data.begin() + static_cast<ptrdiff_t>(at),
                       t.data.begin() + static_cast<ptrdiff_t>(at + bytes));
      at += bytes;
      parts[i].outputs.push_back(std::move(part));
    }
  }
  return parts;
}

OnlineFill::OnlineFill(OnlineRunner runner, OnlineFillOptions options)
    : runner_(std::move(runner)),
      options_(std::move(options)),
      telemetry_(options_.telemetry ? options_.telemetry : std::make_shared<Telemetry>()),
      timer_([this] { TimerLoop(); }) {}

OnlineFill::~OnlineFill() { Stop(); }

void OnlineFill::Stop() {
  std::multimap<int64_t, Request> left;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    left.swap(queue_);
  }
  if (timer_.joinable()) timer_.join();
  for (auto& [deadline, r] : left) {
    r.done(absl::UnavailableError("pswitchd is stopping: the request waited for a bubble"));
  }
}

absl::StatusOr<uint64_t> OnlineFill::Submit(const std::vector<int>& gpus, TaskSpec spec,
                                            TaskCallback done) {
  if (!spec.online_slo || *spec.online_slo <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("an online fill request needs a positive latency objective");
  }
  Request r;
  for (int gpu : gpus) {
    if (gpu < 0 || gpu >= 32) return absl::InvalidArgumentError("no such GPU for online fill");
    r.gpus |= 1u << gpu;
  }
  if (gpus.empty()) return absl::InvalidArgumentError("an online fill request needs a GPU");
  r.overflow_gpu = gpus[0];
  r.arrival_ns = spec.arrival_ns > 0 ? spec.arrival_ns : base::MonotonicNowNs();
  r.objective = *spec.online_slo;
  r.deadline_ns = r.arrival_ns + absl::ToInt64Nanoseconds(*spec.online_slo);
  if (spec.deadline != absl::InfiniteFuture()) {
    // The client's own deadline, when sooner, bounds its wait too (on the monotonic clock).
    const absl::Duration left = spec.deadline - absl::Now();
    r.deadline_ns =
        std::min(r.deadline_ns, base::MonotonicNowNs() +
                                    absl::ToInt64Nanoseconds(std::max(left, absl::ZeroDuration())));
  }
  r.rows = !spec.inputs.empty() && !spec.inputs[0].shape.empty()
               ? std::max<int64_t>(1, spec.inputs[0].shape[0])
               : 1;
  r.spec = std::move(spec);
  r.done = std::move(done);
  uint64_t id = 0;
  std::vector<Pass> passes;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("pswitchd is stopping");
    if (queue_.size() >= options_.max_queued) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the online fill queue holds ", queue_.size(),
                       " requests, its most (--online-fill-queue): try again, or send it as a "
                       "plain request"));
    }
    r.id = kOnlineRequestIdBase + next_id_++;
    id = r.id;
    queue_.emplace(r.deadline_ns, std::move(r));
    queue_changed_ = true;
    // Pull-and-execute: a bubble under way with room serves it now, not the next one.
    for (auto& [gpu, bubble] : bubbles_) PullLocked(gpu, /*at_start=*/false, passes);
  }
  for (Pass& pass : passes) Dispatch(std::move(pass));
  return id;
}

absl::StatusOr<uint64_t> OnlineFill::RunAtOnce(int gpu, TaskSpec spec, TaskCallback done) {
  Request r;
  r.arrival_ns = spec.arrival_ns > 0 ? spec.arrival_ns : base::MonotonicNowNs();
  r.spec = std::move(spec);
  r.done = std::move(done);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("pswitchd is stopping");
    r.id = kOnlineRequestIdBase + next_id_++;
  }
  const uint64_t id = r.id;
  Pass pass{gpu, {}, "no_main_job"};
  pass.requests.push_back(std::move(r));
  Dispatch(std::move(pass));
  return id;
}

OnlineFillStats OnlineFill::Stats() const {
  absl::MutexLock lock(&mu_);
  OnlineFillStats stats = stats_;
  stats.queued = queue_.size();
  return stats;
}

size_t OnlineFill::Queued() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

std::optional<double> OnlineFill::PredictedNs(int gpu, const std::string& model,
                                              int64_t rows) const {
  auto it = measured_.find({gpu, model});
  if (it == measured_.end()) return std::nullopt;
  return it->second.first_ns + it->second.extra_row_ns * static_cast<double>(rows - 1);
}

void OnlineFill::Measure(int gpu, const std::string& model, int64_t rows, double took_ns) {
  Measured& m = measured_[{gpu, model}];
  auto smooth = [](double& value, double sample, bool first) {
    value = first ? sample : value + kSmoothing * (sample - value);
  };
  if (rows <= 1) {
    smooth(m.first_ns, took_ns, !m.one_row_seen);
    m.one_row_seen = true;
  } else if (!m.one_row_seen && !m.batch_seen) {
    // A first pass of several rows: each row as dear as its share, until one-row passes and
    // batches tell the fixed and the per-row parts apart.
    m.first_ns = m.extra_row_ns = took_ns / static_cast<double>(rows);
    m.batch_seen = false;
    queue_changed_ = true;
    return;
  }
  if (rows > 1) {
    const double extra = std::max(0.0, (took_ns - m.first_ns) / static_cast<double>(rows - 1));
    smooth(m.extra_row_ns, extra, !m.batch_seen);
    m.batch_seen = true;
  } else if (!m.batch_seen) {
    m.extra_row_ns = m.first_ns;  // until a batch says otherwise: each row as dear as a pass
  }
  // A latest start may have moved (a first measurement of its model, or a slower one).
  queue_changed_ = true;
}

std::optional<absl::Duration> OnlineFill::Predicted(int gpu, const std::string& model,
                                                    int64_t rows) const {
  absl::MutexLock lock(&mu_);
  std::optional<double> ns = PredictedNs(gpu, model, rows);
  if (!ns) return std::nullopt;
  return Ns(static_cast<int64_t>(*ns));
}

int64_t OnlineFill::LatestStart(const Request& r) const {
  std::optional<double> fastest;
  for (int gpu = 0; gpu < 32; ++gpu) {
    if ((r.gpus & (1u << gpu)) == 0) continue;
    std::optional<double> ns = PredictedNs(gpu, r.spec.model, r.rows);
    if (ns && (!fastest || *ns < *fastest)) fastest = ns;
  }
  if (!fastest) return r.arrival_ns + (r.deadline_ns - r.arrival_ns) * 3 / 4;
  return r.deadline_ns - static_cast<int64_t>(*fastest);
}

absl::Duration OnlineFill::Pull(int gpu, int64_t bubble_end_ns) {
  if (gpu < 0 || gpu >= 32) return absl::ZeroDuration();
  std::vector<Pass> passes;
  double used_ns = 0;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::ZeroDuration();
    OpenBubble& bubble = bubbles_[gpu];
    bubble = OpenBubble{next_bubble_++, bubble_end_ns, 0, false};
    used_ns = PullLocked(gpu, /*at_start=*/true, passes);
  }
  for (Pass& pass : passes) Dispatch(std::move(pass));
  return Ns(static_cast<int64_t>(used_ns));
}

void OnlineFill::BubbleEnded(int gpu) {
  absl::MutexLock lock(&mu_);
  bubbles_.erase(gpu);
}

void OnlineFill::PullOpenBubbles(std::optional<int> only) {
  std::vector<Pass> passes;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    for (auto& [gpu, bubble] : bubbles_) {
      if (only && gpu != *only) continue;
      PullLocked(gpu, /*at_start=*/false, passes);
    }
  }
  for (Pass& pass : passes) Dispatch(std::move(pass));
}

double OnlineFill::PullLocked(int gpu, bool at_start, std::vector<Pass>& passes) {
  auto open = bubbles_.find(gpu);
  if (open == bubbles_.end()) return 0;
  OpenBubble& bubble = open->second;
  const uint32_t bit = 1u << gpu;
  const int64_t now = base::MonotonicNowNs();
  // What is left of the bubble once the passes already handed out, and not yet done, are.
  double left_ns = static_cast<double>(bubble.end_ns - now - bubble.outstanding_ns -
                                       absl::ToInt64Nanoseconds(options_.margin));
  const size_t before = passes.size();
  double used_ns = 0;
  for (auto it = queue_.begin(); it != queue_.end() && left_ns > 0;) {
    const Request& head = it->second;
    if ((head.gpus & bit) == 0) {  // another GPU's main job serves it
      ++it;
      continue;
    }
    std::optional<double> single = PredictedNs(gpu, head.spec.model, head.rows);
    if (!single) {
      // Not measured here: it runs alone, only from a bubble's start (the whole bubble for a
      // run whose length is what it will tell), and the bubble serves nothing more until it
      // is done.
      if (!at_start) {
        ++it;
        continue;
      }
      Pass pass{gpu, {}, "bubble"};
      pass.requests.push_back(std::move(it->second));
      queue_.erase(it);
      pass.bubble = bubble.id;
      pass.predicted_ns = static_cast<int64_t>(std::max(0.0, left_ns));
      bubble.outstanding_ns += pass.predicted_ns;
      used_ns += static_cast<double>(pass.predicted_ns);
      passes.push_back(std::move(pass));
      break;
    }
    if (*single > left_ns) {  // a later, smaller request may still fit
      ++it;
      continue;
    }
    // Batch the later requests that may share its pass while the pass still fits.
    Pass pass{gpu, {}, "bubble"};
    int64_t rows = head.rows;
    uint64_t bytes = 0;
    for (const proto::HostTensor& t : head.spec.inputs) bytes += t.data.size();
    double predicted = *single;
    std::vector<std::multimap<int64_t, Request>::iterator> members{it};
    const bool batchable = measured_.at({gpu, head.spec.model}).batchable;
    for (auto next = std::next(it); batchable && next != queue_.end(); ++next) {
      if ((next->second.gpus & bit) == 0 || !MayBatch(head.spec, next->second.spec)) continue;
      if (rows + next->second.rows > static_cast<int64_t>(options_.max_batch_rows)) continue;
      uint64_t more = 0;
      for (const proto::HostTensor& t : next->second.spec.inputs) more += t.data.size();
      if (bytes + more > options_.max_batch_bytes) continue;
      const double with = *PredictedNs(gpu, head.spec.model, rows + next->second.rows);
      if (with > left_ns) continue;
      rows += next->second.rows;
      bytes += more;
      predicted = with;
      members.push_back(next);
    }
    for (auto m : members) pass.requests.push_back(std::move(m->second));
    auto after = std::next(it);
    for (auto m : members) {
      if (m == after) after = std::next(after);
    }
    for (auto m : members) queue_.erase(m);
    it = after;
    left_ns -= predicted;
    used_ns += predicted;
    pass.bubble = bubble.id;
    pass.predicted_ns = static_cast<int64_t>(predicted);
    bubble.outstanding_ns += pass.predicted_ns;
    passes.push_back(std::move(pass));
  }
  if (passes.size() > before) {
    if (!bubble.counted) {
      bubble.counted = true;
      ++stats_.bubbles_used;
      telemetry_->OnlineBubbleUsed(gpu);
    }
    stats_.passes += passes.size() - before;
    queue_changed_ = true;
  }
  return used_ns;
}

void OnlineFill::Answer(Request& r, const absl::StatusOr<TaskOutcome>& outcome,
                        const char* outcome_label, int gpu) {
  const int64_t now = base::MonotonicNowNs();
  const absl::Duration latency = Ns(now - r.arrival_ns);
  {
    absl::MutexLock lock(&mu_);
    if (!outcome.ok()) {
      ++stats_.failed;
    } else if (std::string_view(outcome_label) == "bubble") {
      ++stats_.in_bubble;
    } else if (std::string_view(outcome_label) == "overflow") {
      ++stats_.overflow_run;
    } else {
      ++stats_.no_main_job;
    }
  }
  telemetry_->OnlineServed(gpu, outcome.ok() ? outcome_label : "failed", r.arrival_ns,
                           Ns(r.dispatched_ns - r.arrival_ns), latency,
                           r.deadline_ns > 0 && now > r.deadline_ns);
  if (!outcome.ok()) {
    r.done(outcome.status());
    return;
  }
  TaskOutcome own = *outcome;
  own.task_id = r.id;
  own.latency = latency;
  r.done(own);
}

void OnlineFill::Release(const Pass& pass) {
  auto open = bubbles_.find(pass.gpu);
  if (pass.bubble == 0 || open == bubbles_.end() || open->second.id != pass.bubble) return;
  open->second.outstanding_ns =
      std::max<int64_t>(0, open->second.outstanding_ns - pass.predicted_ns);
}

void OnlineFill::Dispatch(Pass pass) {
  bool stopping = false;
  {
    absl::MutexLock lock(&mu_);
    stopping = stopping_;
    if (stopping) Release(pass);
  }
  if (stopping) {  // the schedulers may be going: nothing more is handed to them
    for (Request& r : pass.requests) {
      r.done(absl::UnavailableError("pswitchd is stopping: the request waited for a bubble"));
    }
    return;
  }
  const int64_t dispatched = base::MonotonicNowNs();
  for (Request& r : pass.requests) r.dispatched_ns = dispatched;
  std::vector<const TaskSpec*> specs;
  std::vector<int64_t> rows;
  for (const Request& r : pass.requests) {
    specs.push_back(&r.spec);
    rows.push_back(r.rows);
  }
  // One request's spec goes as it is; a batch's inputs are copied once into one (MergeBatch).
  // The requests keep theirs until answered: a batch the scheduler refuses, or whose outputs
  // turn out not to be per row, runs them again one by one.
  TaskSpec spec;
  if (specs.size() == 1) {
    spec = std::move(pass.requests[0].spec);
    pass.requests[0].spec.model = spec.model;  // for the answer's messages
  } else {
    spec = MergeBatch(specs);
  }
  spec.online_slo.reset();
  spec.arrival_ns = 0;  // the scheduler's: its service time is measured from here
  const int gpu = pass.gpu;
  const std::string model = spec.model;
  int64_t total_rows = 0;
  for (int64_t r : rows) total_rows += r;
  auto shared = std::make_shared<Pass>(std::move(pass));
  // Runs each request of a batch on its own (the batch could not run as one), each counted in
  // the batch's bubble (if it is still open) at its own predicted time.
  auto one_by_one = [this, shared] {
    std::vector<Pass> alone;
    {
      absl::MutexLock lock(&mu_);
      auto open = bubbles_.find(shared->gpu);
      for (Request& r : shared->requests) {
        Pass pass{shared->gpu, {}, shared->outcome};
        if (open != bubbles_.end() && open->second.id == shared->bubble) {
          pass.bubble = shared->bubble;
          pass.predicted_ns =
              static_cast<int64_t>(PredictedNs(shared->gpu, r.spec.model, r.rows).value_or(0));
          open->second.outstanding_ns += pass.predicted_ns;
        }
        pass.requests.push_back(std::move(r));
        alone.push_back(std::move(pass));
      }
    }
    for (Pass& pass : alone) Dispatch(std::move(pass));
  };
  const int64_t submitted = base::MonotonicNowNs();
  absl::StatusOr<uint64_t> queued = runner_(
      gpu, std::move(spec),
      [this, shared, rows, model, total_rows, submitted,
       one_by_one](const absl::StatusOr<TaskOutcome>& outcome) {
        const int gpu = shared->gpu;
        const double took = static_cast<double>(outcome.ok() ? ServiceNs(*outcome, submitted)
                                                             : base::MonotonicNowNs() - submitted);
        std::vector<TaskOutcome> parts;
        absl::Status split = absl::OkStatus();
        if (outcome.ok() && rows.size() > 1) {
          absl::StatusOr<std::vector<TaskOutcome>> s = SplitBatch(*outcome, rows);
          if (s.ok()) {
            parts = *std::move(s);
          } else {
            split = s.status();
          }
        }
        const bool overflow = std::string_view(shared->outcome) == "overflow";
        {
          absl::MutexLock lock(&mu_);
          if (outcome.ok()) {
            Measure(gpu, model, total_rows, took);
            if (!split.ok()) measured_[{gpu, model}].batchable = false;
          }
          if (overflow) stats_.overflow_time += Ns(static_cast<int64_t>(took));
          Release(*shared);  // its bubble's time is free again, however long it took
        }
        if (overflow) telemetry_->OnlineOverflowTime(gpu, Ns(static_cast<int64_t>(took)));
        if (!outcome.ok() && shared->requests.size() > 1 && !absl::IsCancelled(outcome.status()) &&
            !absl::IsUnavailable(outcome.status())) {
          // The batch failed as a whole (its size may be why): each request on its own, so each
          // gets its own answer.
          one_by_one();
          return;
        }
        if (!split.ok()) {
          // Its outputs are not per row: each request runs again alone, nothing is lost.
          base::Log(base::LogLevel::kWarn, "online_fill_unbatchable")
              .Field("model", model)
              .Field("error", split);
          one_by_one();
          return;
        }
        // Pull-and-execute: the next requests that fit what is left of the bubble.
        if (std::string_view(shared->outcome) == "bubble") PullOpenBubbles(gpu);
        for (size_t i = 0; i < shared->requests.size(); ++i) {
          if (!outcome.ok()) {
            Answer(shared->requests[i], outcome.status(), shared->outcome, gpu);
          } else {
            Answer(shared->requests[i], rows.size() > 1 ? parts[i] : *outcome, shared->outcome,
                   gpu);
          }
        }
      });
  if (!queued.ok()) {
    {
      absl::MutexLock lock(&mu_);
      Release(*shared);
    }
    if (shared->requests.size() > 1) {
      // The batch as a whole was refused (by a bound the members each keep): one by one.
      one_by_one();
      return;
    }
    for (Request& r : shared->requests) Answer(r, queued.status(), shared->outcome, gpu);
  }
}

void OnlineFill::TimerLoop() {
  pthread_setname_np(pthread_self(), "pswitch-online");
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const int64_t now = base::MonotonicNowNs();
    int64_t next = now + absl::ToInt64Nanoseconds(absl::Seconds(1));
    std::vector<Pass> overflow;
    std::vector<std::pair<int, Request>> refused;  // with its GPU
    for (auto it = queue_.begin(); it != queue_.end();) {
      const int64_t latest = LatestStart(it->second);
      if (latest > now) {
        next = std::min(next, latest);
        ++it;
        continue;
      }
      const int gpu = it->second.overflow_gpu;
      if (options_.overflow == OnlineOverflow::kRun) {
        Pass pass{gpu, {}, "overflow"};
        pass.requests.push_back(std::move(it->second));
        overflow.push_back(std::move(pass));
      } else {
        refused.emplace_back(gpu, std::move(it->second));
      }
      it = queue_.erase(it);
    }
    if (!overflow.empty() || !refused.empty()) {
      stats_.refused += refused.size();
      const size_t bubbles_open = bubbles_.size();
      mu_.Unlock();
      for (Pass& pass : overflow) Dispatch(std::move(pass));
      for (auto& [gpu, r] : refused) {
        const absl::Duration slo = r.objective;
        base::Log(base::LogLevel::kInfo, "online_fill_refused")
            .Field("model", r.spec.model)
            .FieldMs("objective_ms", slo)
            .FieldMs("waited_ms", Ns(base::MonotonicNowNs() - r.arrival_ns))
            .Field("open_bubbles", bubbles_open);
        const absl::Duration waited = Ns(base::MonotonicNowNs() - r.arrival_ns);
        telemetry_->OnlineServed(gpu, "refused", r.arrival_ns, waited, waited, false);
        r.done(absl::DeadlineExceededError(absl::StrCat(
            "online fill request on '", r.spec.model,
            "': no bubble of the main job had room for it in time for its latency objective of ",
            absl::FormatDuration(slo),
            " (pswitchd --online-fill-overflow=refuse; send it without an objective to run it "
            "at once)")));
      }
      mu_.Lock();
      continue;
    }
    queue_changed_ = false;
    const absl::Duration wait = Ns(std::max<int64_t>(0, next - now));
    mu_.AwaitWithTimeout(absl::Condition(this, &OnlineFill::TimerWoken), wait);
  }
}

}  // namespace pswitch::controller
