// The gate a worker puts before every layer of a task (PipeSwitch's pipelined execution): each
// layer waits for its group's ready flag under the epoch of the copy that brought the weights
// (once per group: groups arrive in order), the stream is marked where the first layer starts
// and ends and where each later group's gate releases (the trace's per-group compute), and after
// the task every group it passed must hold exactly that epoch, so a result is never computed on
// stale weights. A worker's Prepare sets the gate for the next tasks of a model (LayerGate::Set);
// each task installs it on its model for its run (Task).
#ifndef PSWITCH_WORKER_LAYER_GATE_H_
#define PSWITCH_WORKER_LAYER_GATE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/nvtx.h"
#include "gpu/device.h"
#include "gpu/flags.h"
#include "worker/model_binding.h"

namespace pswitch::worker {

class LayerGate {
 public:
  // What Prepare said: `model`'s layer l (layout order) waits on ready flag
  // flag_base + group_of_layer[l] for `epoch`.
  struct Spec {
    std::string model;
    uint32_t epoch = 0;
    uint32_t flag_base = 0;
    std::vector<uint32_t> group_of_layer;
  };
  // From Prepare's group_last_layer (the last layout layer of each group) for `layers` layers.
  static Spec FromLastLayers(std::string model, uint32_t epoch, uint32_t flag_base,
                             const std::vector<uint32_t>& group_last_layer, size_t layers);

  LayerGate(gpu::FlagArray* ready_flags, absl::Duration group_timeout)
      : ready_flags_(ready_flags), group_timeout_(group_timeout) {}

  void Set(Spec spec) { spec_ = std::move(spec); }
  // `model` was dropped: its gate goes with it.
  void Forget(const std::string& model) {
    if (spec_.model == model) spec_ = Spec{};
  }
  bool Prepared(const std::string& model) const { return spec_.model == model; }
  uint32_t groups() const;

  // Waits on the CPU until every group is in, up to `deadline_ns` (CLOCK_MONOTONIC):
  // DeadlineExceeded past it (a fill task whose bubble ends first).
  absl::Status AwaitAll(int64_t deadline_ns) const;

  // One task's pass through the gate: installed on `bound` for its run in `training` mode, on
  // `stream`; removed when it goes out of scope.
  class Task {
   public:
    // `cut` (may be null): once set, the next layer throws models::StepCut, which the training
    // step under way turns into a step that left no trace (Trainer::Step); so does the first
    // layer at or past the time `cut_at_ns` holds (CLOCK_MONOTONIC; null or 0: none), a fill
    // step's bubble end (a resident run's changes with each bubble), unless `suspend` (null:
    // none) lets the step wait there for a later bubble (models::StepCutPoint).
    Task(const LayerGate& gate, BoundModel& bound, bool training, gpu::Stream& stream,
         const std::string& model, uint64_t task_id, const std::atomic<bool>* cut = nullptr,
         const std::atomic<int64_t>* cut_at_ns = nullptr,
         const std::function<bool()>* suspend = nullptr);
    ~Task();
    Task(const Task&) = delete;
    Task& operator=(const Task&) = delete;

    // Runs `body` (the task's forward passes, through libtorch) with the gate installed: a
    // gate's failure (a flag that never came, a superseded copy, a layer outside the model)
    // is returned as such, ahead of libtorch's error and then `body`'s own status.
    absl::Status Run(const std::function<absl::Status()>& body);
    // Before a training step: when every group still ahead is already in (its flag holds the
    // epoch), passes their gates now and returns true, so the step may read all the weights at
    // its start; false while some are still arriving (each layer's gate then waits as ever).
    bool PassAllIfIn();
    // After the stream synchronised: the stream's marks (first layer start and end, each later
    // group's release), and whether every group the task passed holds the epoch.
    struct Marks {
      int64_t first_layer_start_ns = 0;
      int64_t first_layer_done_ns = 0;
      std::vector<int64_t> group_gates_ns;
    };
    Marks TakeMarks();
    absl::Status CheckEpoch() const;

   private:
    void OnLayer(int index);

    const LayerGate& gate_;
    BoundModel& bound_;
    const bool training_;
    gpu::Stream& stream_;
    const std::atomic<bool>* const cut_;
    const std::atomic<int64_t>* const cut_at_ns_;
    const std::function<bool()>* const suspend_;
    const std::string what_;
    int waited_group_ = -1;
    int hooks_ = 0;
    size_t gated_marks_ = 0;  // marks of groups after the first
    base::NvtxRange task_range_;
    base::NvtxRange group_range_;
  };

 private:
  gpu::FlagArray* const ready_flags_;
  const absl::Duration group_timeout_;
  Spec spec_;
};

}  // namespace pswitch::worker

#endif  // PSWITCH_WORKER_LAYER_GATE_H_
