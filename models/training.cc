#include "models/training.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <map>
#include <sstream>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/status.h"

namespace pswitch::models {
namespace {

constexpr uint64_t kStateAlignment = 256;

uint64_t AlignUp(uint64_t value) {
  return (value + kStateAlignment - 1) / kStateAlignment * kStateAlignment;
}

std::vector<at::Tensor> TrainableParameters(ZooModel& model) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : model.parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

// libtorch keys optimizer state by the parameter's TensorImpl: a string of its address in 1.x,
// the address itself in 2.x. Derive the key type from the map so both compile.
template <typename StateMap>
typename StateMap::key_type StateKey(const at::Tensor& p) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;  // what 1.x's c10::guts::to_string does with a pointer
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// Pre-creates every parameter's optimizer state as views into `state`, so the optimizer's
// in-place updates land there.
void BindExternalState(torch::optim::Optimizer& optimizer, const TrainerOptions& options,
                       const std::vector<at::Tensor>& params, const ExternalOptimizerState& state,
                       uint64_t slot_bytes) {
  auto& states = optimizer.state();
  using StateMap = std::remove_reference_t<decltype(states)>;
  uint64_t offset = 0;
  for (const at::Tensor& p : params) {
    auto view = [&](int slot) {
      return torch::from_blob(state.storage.data() + slot * slot_bytes + offset, p.sizes(),
                              p.options().requires_grad(false));
    };
    if (options.optimizer == OptimizerKind::kAdam) {
      auto s = std::make_unique<torch::optim::AdamParamState>();
      s->step(state.steps_taken);
      s->exp_avg(view(0));
      s->exp_avg_sq(view(1));
      states[StateKey<StateMap>(p)] = std::move(s);
    } else {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(view(0));
      states[StateKey<StateMap>(p)] = std::move(s);
    }
    offset += AlignUp(p.nbytes());
  }
}

}  // namespace

uint64_t OptimizerSlotBytes(ZooModel& model) {
  uint64_t bytes = 0;
  for (const at::Tensor& p : TrainableParameters(model)) bytes += AlignUp(p.nbytes());
  return bytes;
}

Trainer::Trainer(ZooModel& model, std::unique_ptr<torch::optim::Optimizer> optimizer,
                 std::unique_ptr<BufferSnapshot> buffers)
    : model_(model), optimizer_(std::move(optimizer)), buffers_(std::move(buffers)) {}

Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(ZooModel& model,
                                                         const TrainerOptions& options,
                                                         const ExternalOptimizerState* state) {
  if (!(options.learning_rate > 0) || !std::isfinite(options.learning_rate)) {
    return absl::InvalidArgumentError("learning rate must be positive and finite");
  }
  if (!(options.momentum >= 0 && options.momentum < 1)) {
    return absl::InvalidArgumentError("momentum must be in [0, 1)");
  }
  const int slots = OptimizerStateSlots(options);
  const uint64_t slot_bytes = OptimizerSlotBytes(model);
  if (state != nullptr && state->storage.size() != slots * slot_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", model.model_name(), "': optimizer state of ", state->storage.size(),
                     " bytes, the optimizer needs ", slots, " x ", slot_bytes));
  }
  if (state != nullptr && state->steps_taken < 0) {
    return absl::InvalidArgumentError("negative optimizer step count");
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::vector<at::Tensor> params = TrainableParameters(model);
  PSWITCH_RETURN_IF_ERROR(
      CatchTorch(absl::StrCat("model '", model.model_name(), "': optimizer"), [&] {
        if (options.optimizer == OptimizerKind::kAdam) {
          optimizer = std::make_unique<torch::optim::Adam>(
              params, torch::optim::AdamOptions(options.learning_rate));
        } else {
          optimizer = std::make_unique<torch::optim::SGD>(
              params, torch::optim::SGDOptions(options.learning_rate).momentum(options.momentum));
        }
        if (state != nullptr && slots > 0) {
          BindExternalState(*optimizer, options, params, *state, slot_bytes);
        }
      }));
  std::unique_ptr<BufferSnapshot> buffers;
  PSWITCH_RETURN_IF_ERROR(CatchTorch(
      absl::StrCat("model '", model.model_name(), "': buffer snapshot"),
      [&] { buffers = std::make_unique<BufferSnapshot>(model.buffers(/*recurse=*/true)); }));
  return std::unique_ptr<Trainer>(new Trainer(model, std::move(optimizer), std::move(buffers)));
}

namespace {

// Forward, loss and backward in train mode; the loss stays on the device.
at::Tensor ForwardBackward(ZooModel& model, const ModelInput& input, const at::Tensor& target) {
  model.train();
  ModelOutput out = model.Forward(input);
  at::Tensor loss = model.Loss(out, target);
  loss.backward();
  return loss;
}

}  // namespace

absl::StatusOr<double> ComputeGradients(ZooModel& model, const ModelInput& input,
                                        const at::Tensor& target) {
  double loss_value = 0;
  PSWITCH_RETURN_IF_ERROR(
      CatchTorch(absl::StrCat("model '", model.model_name(), "': gradients"),
                 [&] { loss_value = ForwardBackward(model, input, target).item<double>(); }));
  return loss_value;
}

absl::Status WarmOptimizer(const TrainerOptions& options, const std::vector<at::Tensor>& like) {
  return CatchTorch("warming the optimizer", [&] {
    std::vector<at::Tensor> params;
    params.reserve(like.size());
    for (const at::Tensor& l : like) {
      at::Tensor param = at::zeros_like(l).set_requires_grad(true);
      param.mutable_grad() = at::ones_like(l);
      params.push_back(std::move(param));
    }
    if (options.optimizer == OptimizerKind::kAdam) {
      torch::optim::Adam adam(params, torch::optim::AdamOptions(options.learning_rate));
      adam.step();
    } else {
      torch::optim::SGD sgd(
          params, torch::optim::SGDOptions(options.learning_rate).momentum(options.momentum));
      sgd.step();
    }
  });
}

namespace {

constexpr char kStepCutPayload[] = "pswitch.dev/step-cut";

// Runs before a backward node: a Stop seen there cuts the step mid-backward. The autograd engine
// hands what a hook throws back to backward()'s caller as itself (Trainer::Step's catch).
class CutHook final : public torch::autograd::FunctionPreHook {
 public:
  explicit CutHook(const StepCutOptions& cut) : cut_(cut) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    cut_.AtPoint();
    return grads;
  }

 private:
  const StepCutOptions cut_;
};

// Every node of `loss`'s graph gets a CutHook: the backward, two thirds of a step, stops within
// one node of a Stop rather than running to its end. The graph is the step's own (built by its
// forward), so hooks never pile up; the walk is a few hundred nodes, tens of microseconds.
void CutBackwardAtEveryNode(const at::Tensor& loss, const StepCutOptions& cut) {
  std::vector<torch::autograd::Node*> pending;
  std::unordered_set<torch::autograd::Node*> seen;
  if (const std::shared_ptr<torch::autograd::Node>& fn = loss.grad_fn(); fn != nullptr) {
    pending.push_back(fn.get());
  }
  while (!pending.empty()) {
    torch::autograd::Node* node = pending.back();
    pending.pop_back();
    if (!seen.insert(node).second) continue;
    node->add_pre_hook(std::make_unique<CutHook>(cut));
    for (const torch::autograd::Edge& edge : node->next_edges()) {
      if (edge.function != nullptr) pending.push_back(edge.function.get());
    }
  }
}

}  // namespace

namespace {
bool PastDeadline(int64_t deadline_ns) {
  return deadline_ns != 0 && base::MonotonicNowNs() >= deadline_ns;
}
}  // namespace

bool StepCutOptions::Now() const {
  return (stop != nullptr && stop->load(std::memory_order_relaxed)) ||
         (deadline_ns != nullptr && PastDeadline(deadline_ns->load(std::memory_order_relaxed)));
}

void StepCutPoint(const std::atomic<bool>* stop, const std::atomic<int64_t>* deadline_ns,
                  const std::function<bool()>* suspend) {
  while (true) {
    if (stop != nullptr && stop->load(std::memory_order_relaxed)) throw StepCut();
    if (deadline_ns == nullptr || !PastDeadline(deadline_ns->load(std::memory_order_relaxed))) {
      return;
    }
    if (suspend == nullptr || !(*suspend)()) throw StepCut();
  }
}

void StepCutOptions::AtPoint() const { StepCutPoint(stop, deadline_ns, suspend); }

absl::Status StepCutError() {
  absl::Status status = absl::AbortedError("training step cut at a layer boundary");
  status.SetPayload(kStepCutPayload, absl::Cord("1"));
  return status;
}

bool IsStepCut(const absl::Status& status) {
  return status.GetPayload(kStepCutPayload).has_value();
}

Trainer::BufferSnapshot::BufferSnapshot(const std::vector<at::Tensor>& buffers) {
  std::map<at::ScalarType, size_t> group_of;
  std::vector<int64_t> numel;
  for (const at::Tensor& b : buffers) {
    // What a forward updates: floating-point statistics and scalar counters (BatchNorm's
    // running mean and variance, num_batches_tracked). Masks and index tables (bool, or
    // integers of many elements) are constants and cost nothing here.
    if (!b.defined() || b.numel() == 0) continue;
    if (!at::isFloatingType(b.scalar_type()) && b.numel() != 1) continue;
    if (!slot_of_.emplace(b.unsafeGetTensorImpl(), slots_.size()).second) continue;
    auto [it, added] = group_of.try_emplace(b.scalar_type(), groups_.size());
    if (added) {
      groups_.emplace_back();
      numel.push_back(0);
    }
    const size_t g = it->second;
    groups_[g].buffers.push_back(b);
    slots_.push_back(Slot{b, g, numel[g]});
    numel[g] += b.numel();
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].copy = at::empty({numel[g]}, groups_[g].buffers.front().options());
  }
}

void Trainer::BufferSnapshot::TakeAll() {
  for (Group& g : groups_) {
    std::vector<at::Tensor> flat;
    flat.reserve(g.buffers.size());
    for (const at::Tensor& b : g.buffers) flat.push_back(b.reshape(-1));  // a view when it can
    at::cat_out(g.copy, flat, 0);
  }
  StartPiecewise();
  all_taken_ = true;
}

void Trainer::BufferSnapshot::StartPiecewise() {
  all_taken_ = false;
  for (size_t i : taken_) slots_[i].taken = false;
  taken_.clear();
}

void Trainer::BufferSnapshot::Put(const Slot& slot, bool take) {
  at::Tensor saved = groups_[slot.group]
                         .copy.narrow(0, slot.offset, slot.buffer.numel())
                         .view(slot.buffer.sizes());
  if (take) {
    saved.copy_(slot.buffer);
  } else {
    slot.buffer.copy_(saved);
  }
}

void Trainer::BufferSnapshot::Take(const std::vector<at::Tensor>& buffers) {
  if (all_taken_) return;
  for (const at::Tensor& b : buffers) {
    auto it = b.defined() ? slot_of_.find(b.unsafeGetTensorImpl()) : slot_of_.end();
    if (it == slot_of_.end() || slots_[it->second].taken) continue;
    Slot& slot = slots_[it->second];
    Put(slot, /*take=*/true);
    slot.taken = true;
    taken_.push_back(it->second);
  }
}

void Trainer::BufferSnapshot::Restore() {
  torch::NoGradGuard no_grad;
  if (all_taken_) {
    for (const Slot& slot : slots_) Put(slot, /*take=*/false);
    return;
  }
  for (size_t i : taken_) Put(slots_[i], /*take=*/false);
}

absl::StatusOr<double> Trainer::Step(const ModelInput& input, const at::Tensor& target,
                                     StepParts* parts, StepCutOptions cut) {
  double loss_value = 0;
  bool was_cut = false;
  const auto check_cut = [&cut] { cut.AtPoint(); };
  // While weights arrive, each layer's buffers are taken at its gate (after its group came).
  struct AfterGate {
    ZooModel* model = nullptr;
    ~AfterGate() {
      if (model != nullptr) model->SetAfterGateHook(nullptr);
    }
  } after_gate;
  PSWITCH_RETURN_IF_ERROR(
      CatchTorch(absl::StrCat("model '", model_.model_name(), "': training step"), [&] {
        if (cut.armed() && cut.arriving_buffers == nullptr) {
          buffers_->TakeAll();
        } else if (cut.armed()) {
          buffers_->StartPiecewise();
          after_gate.model = &model_;
          model_.SetAfterGateHook([this, calls = cut.arriving_buffers](int index) {
            if (index >= 0 && static_cast<size_t>(index) < calls->size()) {
              buffers_->Take((*calls)[index]);
            }
          });
        }
        try {
          const int64_t start = base::MonotonicNowNs();
          optimizer_->zero_grad();
          model_.train();
          ModelOutput out = model_.Forward(input);
          check_cut();
          at::Tensor loss = model_.Loss(out, target);
          if (cut.armed()) CutBackwardAtEveryNode(loss, cut);
          try {
            loss.backward();
          } catch (const StepCut&) {
            throw;
          } catch (...) {
            // Should an engine hand a hook's exception back wrapped, a set flag still says why
            // (and a real error, were it to coincide, comes back when the step runs again). A
            // step that suspends is not cut by its deadline: an error then is the step's.
            if (cut.stop != nullptr && cut.stop->load(std::memory_order_relaxed)) throw StepCut();
            if (cut.suspend == nullptr && cut.Now()) throw StepCut();
            throw;
          }
          check_cut();  // the last point before the parameters change
          const int64_t backward_issued = base::MonotonicNowNs();
          optimizer_->step();
          const int64_t update_issued = base::MonotonicNowNs();
          loss_value = loss.item<double>();
          if (parts != nullptr) {
            parts->forward_backward_ns = backward_issued - start;
            parts->update_ns = update_issued - backward_issued;
            parts->loss_wait_ns = base::MonotonicNowNs() - update_issued;
          }
        } catch (const StepCut&) {
          was_cut = true;
        }
        // Gradients are zeroed by the next step; what the forward wrote is put back now (on a
        // GPU, queued on the same stream, so it lands before the task's final synchronisation).
        if (was_cut) buffers_->Restore();
      }));
  if (was_cut) return StepCutError();
  return loss_value;
}

}  // namespace pswitch::models
