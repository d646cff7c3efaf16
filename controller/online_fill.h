// Online inference in the main job's bubbles (SpecInF's pull-and-execute; issue 30 item 4). An
// inference request marked with a latency objective (TaskSpec::online_slo) waits in one online
// queue, eligible for every GPU that runs a main job; the GPU whose bubble begins first pulls it
// (SpecInF's pull-based idea: no GPU is chosen ahead of its bubbles). A pull takes the queue
// earliest deadline first: every request
// whose predicted service fits what is left of the bubble runs then, and requests of one model
// and one principal whose inputs are inline and alike are batched into one pass. A request that
// no bubble can serve in time any more (its latest start passed) is answered as the operator
// chose (--online-fill-overflow): run at once, preempting the main job, with its time counted,
// or refused with the reason.
//
// A prediction is per GPU and model: a smoothed measurement of its runs' service time (placement
// on a worker to the answer, a weights copy left out: the cache keeps the model resident after
// its first run), per pass and per row.
// A model not measured yet on a GPU runs alone from the start of one of its bubbles, so that it
// is measured; until then its latest start is three quarters into its objective.
#ifndef PSWITCH_CONTROLLER_ONLINE_FILL_H_
#define PSWITCH_CONTROLLER_ONLINE_FILL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/task_spec.h"
#include "controller/telemetry.h"

namespace pswitch::controller {

enum class OnlineOverflow {
  kRun,     // run it at once, preempting the main job (counted: pswitch_online_fill_*)
  kRefuse,  // answer DeadlineExceeded with the reason; the main job is never touched
};
absl::StatusOr<OnlineOverflow> ParseOnlineOverflow(absl::string_view text);
const char* OnlineOverflowName(OnlineOverflow overflow);

struct OnlineFillOptions {
  OnlineOverflow overflow = OnlineOverflow::kRefuse;
  // Left free before a bubble's end: a pulled run must be predicted to end before it.
  absl::Duration margin = absl::Microseconds(300);
  size_t max_queued = 1024;              // beyond, Submit is refused
  uint32_t max_batch_rows = 256;         // rows of one batched pass (the controller's --max-batch)
  uint64_t max_batch_bytes = 48ull << 20;  // its inputs' bytes (the controller's --max-input-bytes)
  std::shared_ptr<Telemetry> telemetry;  // null: its own
};

// Where a pulled request runs: GPU `gpu`'s scheduler (Controller::SubmitTo), a fake in tests.
// `done` runs once if it returns OK.
using OnlineRunner =
    std::function<absl::StatusOr<uint64_t>(int gpu, TaskSpec spec, TaskCallback done)>;

struct OnlineFillStats {
  uint64_t in_bubble = 0;        // requests answered from a bubble
  uint64_t overflow_run = 0;     // run outside a bubble (--online-fill-overflow=run)
  uint64_t no_main_job = 0;      // run at once: their GPU had no main job (no bubble cycle)
  uint64_t refused = 0;          // objective not met, refused
  uint64_t failed = 0;           // their run failed (the model unloaded meanwhile, ...)
  uint64_t passes = 0;           // runs in bubbles (a batch is one)
  uint64_t bubbles_used = 0;     // bubbles that served at least one request
  absl::Duration overflow_time;  // service time of overflow runs: the main job's cost
  size_t queued = 0;
};

// Thread-safe. Runs one thread (the latest-start timer).
class OnlineFill {
 public:
  OnlineFill(OnlineRunner runner, OnlineFillOptions options);
  // Stop() first.
  ~OnlineFill();
  // Every request still queued is answered Unavailable, and nothing more runs: Submit and
  // RunAtOnce are refused, Pull starts nothing. Runs already out answer on their own. Call it
  // before the runner's scheduler goes.
  void Stop();
  OnlineFill(const OnlineFill&) = delete;
  OnlineFill& operator=(const OnlineFill&) = delete;

  // Queues a checked inference request (spec.online_slo set) for the bubbles of `gpus` (not
  // empty, each < 32; an overflow runs on the first); ResourceExhausted when the queue is full,
  // InvalidArgument without an objective or GPUs. `done` runs exactly once if this returns OK
  // (the id is this class's own: the request has no scheduler task yet).
  absl::StatusOr<uint64_t> Submit(const std::vector<int>& gpus, TaskSpec spec, TaskCallback done);
  // Runs `spec` on `gpu` now, counted as served with no main job there.
  absl::StatusOr<uint64_t> RunAtOnce(int gpu, TaskSpec spec, TaskCallback done);
  // A bubble began on `gpu`, ending at `bubble_end_ns` (CLOCK_MONOTONIC): starts every queued
  // request that fits, earliest deadline first. Returns the predicted time they take (the rest
  // of the bubble is the offline fill jobs').
  absl::Duration Pull(int gpu, int64_t bubble_end_ns);
  // `gpu`'s bubble ended: requests that arrive from now on wait for its next one. Until then
  // (or its predicted end), a request that arrives is served at once if the bubble still has
  // room for it once what was handed out is done, and each pass that ends pulls the next
  // (pull-and-execute).
  void BubbleEnded(int gpu);
  OnlineFillStats Stats() const;
  // Requests waiting for a bubble.
  size_t Queued() const;
  // The predicted service of a pass of `rows` rows of `model` on `gpu`; nullopt: not measured.
  std::optional<absl::Duration> Predicted(int gpu, const std::string& model, int64_t rows) const;

 private:
  struct Request {
    uint64_t id = 0;
    TaskSpec spec;
    TaskCallback done;
    int64_t arrival_ns = 0;
    absl::Duration objective;   // its latency objective
    int64_t deadline_ns = 0;    // arrival + objective, or the client's deadline if sooner
    int64_t rows = 1;           // the input's first dimension
    int64_t dispatched_ns = 0;  // handed to the GPU's scheduler (its queueing ends)
    uint32_t gpus = 0;          // the GPUs whose bubbles may serve it, one bit each
    int overflow_gpu = 0;       // where it runs if none can in time
  };
  // A pass's service predicted as first_ns + extra_row_ns * (rows - 1): both smoothed, the
  // first from one-row passes (or any pass, until one comes), the second from batches (the
  // first's value until one comes: each row as dear as a pass).
  struct Measured {
    double first_ns = 0;
    double extra_row_ns = 0;
    bool one_row_seen = false;
    bool batch_seen = false;
    bool batchable = true;  // false once a batched pass's outputs were not per row
  };
  // A run of one or several requests (one pass), with where it came from.
  struct Pass {
    int gpu = 0;
    std::vector<Request> requests;
    const char* outcome = "bubble";  // Telemetry's label
    uint64_t bubble = 0;             // the open bubble it was handed out in (0: none)
    int64_t predicted_ns = 0;        // what it was counted for there
  };

  struct OpenBubble {
    uint64_t id = 0;             // this bubble, apart from the GPU's earlier and later ones
    int64_t end_ns = 0;          // predicted (CLOCK_MONOTONIC)
    int64_t outstanding_ns = 0;  // predicted time of the passes handed out and not yet done
    bool counted = false;        // served a request (OnlineFillStats::bubbles_used)
  };
  // Hands out what fits in `gpu`'s open bubble, appending to `passes`; the predicted time taken.
  // A model not measured on `gpu` yet is handed out only at the bubble's start (`at_start`),
  // alone, holding the rest of the bubble.
  double PullLocked(int gpu, bool at_start, std::vector<Pass>& passes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a pass of `rows` rows that took `took_ns`.
  void Measure(int gpu, const std::string& model, int64_t rows, double took_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PullLocked on every open bubble (or `only`'s), then dispatches.
  void PullOpenBubbles(std::optional<int> only = std::nullopt);
  // The latest time `r` may start and still meet its objective (on its fastest GPU).
  int64_t LatestStart(const Request& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<double> PredictedNs(int gpu, const std::string& model, int64_t rows) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `pass` no longer takes its bubble's time (done, refused, or never run).
  void Release(const Pass& pass) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `pass` (off mu_): one spec for all its requests, answered each with its own rows.
  void Dispatch(Pass pass);
  void Answer(Request& r, const absl::StatusOr<TaskOutcome>& outcome, const char* outcome_label,
              int gpu);
  void TimerLoop();
  // Whether the timer has something new to look at (a submission or a pull), or must stop.
  bool TimerWoken() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || queue_changed_; }

  const OnlineRunner runner_;
  const OnlineFillOptions options_;
  const std::shared_ptr<Telemetry> telemetry_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool queue_changed_ ABSL_GUARDED_BY(mu_) = false;  // wakes the timer to recompute
  // In deadline order.
  std::multimap<int64_t, Request> queue_ ABSL_GUARDED_BY(mu_);
  std::map<int, OpenBubble> bubbles_ ABSL_GUARDED_BY(mu_);  // by GPU
  uint64_t next_bubble_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::pair<int, std::string>, Measured> measured_ ABSL_GUARDED_BY(mu_);
  OnlineFillStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread timer_;  // last: it uses every member above
};

// Online requests' ids (OnlineFill::Submit) lie at and above this, apart from the schedulers'.
inline constexpr uint64_t kOnlineRequestIdBase = 1ull << 62;

// Whether requests `a` and `b` may share one pass: the same model and the same known principal
// (a pass is one tenant's: a model sees every row of its batch), inline inputs only, alike in
// names, dtypes and all but the first dimension, each request's inputs with one first dimension,
// no output place, nothing still arriving.
bool MayBatch(const TaskSpec& a, const TaskSpec& b);
// The inputs of `specs` (MayBatch with one another) concatenated along their first dimension,
// in order, as one spec: one pass over their bytes, in place of one run each.
TaskSpec MergeBatch(const std::vector<const TaskSpec*>& specs);
// Each request's share of a batched outcome: its `rows[i]` rows of every output, in order.
// InvalidArgument when an output's first dimension is not the rows' sum (a model whose outputs
// are not per row cannot be batched: that batch's requests run again one by one, and the model
// is not batched again).
absl::StatusOr<std::vector<TaskOutcome>> SplitBatch(TaskOutcome outcome,
                                                    const std::vector<int64_t>& rows);

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_ONLINE_FILL_H_
