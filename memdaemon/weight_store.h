// The weight store: every registered model's parameters and buffers, once, in pinned host
// memory, laid out by ComputeWeightLayout (execution order, 256-byte alignment) so a
// transmission is a handful of large contiguous copies per group.
#ifndef PSWITCH_MEMDAEMON_WEIGHT_STORE_H_
#define PSWITCH_MEMDAEMON_WEIGHT_STORE_H_

#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu/device.h"
#include "memdaemon/weight_layout.h"

namespace pswitch::memdaemon {

// A model as it is registered: layers in execution order, each with its named tensors' bytes.
// The spans are read during Register only.
struct TensorBytes {
  std::string name;
  std::span<const std::byte> bytes;
};
struct LayerBytes {
  std::string name;
  std::vector<TensorBytes> tensors;
};
struct ModelBytes {
  std::string name;
  std::vector<LayerBytes> layers;
};

// The names and sizes of `model`'s tensors, the input of ComputeWeightLayout.
std::vector<LayerSpec> LayerSpecsOf(const ModelBytes& model);

// A registered model. Immutable once registered, except its pinned bytes, which a training
// checkpoint may overwrite in place (same layout).
class StoredModel {
 public:
  StoredModel(std::string name, std::vector<LayerSpec> layers, WeightLayout layout,
              std::unique_ptr<gpu::HostBuffer> buffer)
      : name_(std::move(name)),
        layers_(std::move(layers)),
        layout_(std::move(layout)),
        buffer_(std::move(buffer)) {}
  StoredModel(const StoredModel&) = delete;
  StoredModel& operator=(const StoredModel&) = delete;

  const std::string& name() const { return name_; }
  const std::vector<LayerSpec>& layers() const { return layers_; }
  const WeightLayout& layout() const { return layout_; }
  size_t num_layers() const { return layers_.size(); }
  uint64_t total_bytes() const { return layout_.total_bytes; }
  // Pinned host bytes, laid out exactly as the model's arena region.
  std::byte* host_bytes() const { return buffer_->data(); }
  // total_bytes() to a whole page, the rest zeros: what a copy writes, so no byte of a region's
  // last page is left from the memory's earlier owner (a worker's access to it is by page).
  uint64_t padded_bytes() const { return buffer_->size_bytes(); }
  // Which version of the weights the pinned bytes hold: a training checkpoint writes new ones
  // (MemDaemon::CheckpointWeights), and a GPU whose cache copied an older generation must copy
  // again rather than serve it.
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }
  // Returns the new generation.
  uint64_t NewGeneration() const { return generation_.fetch_add(1, std::memory_order_acq_rel) + 1; }

 private:
  mutable std::atomic<uint64_t> generation_{0};
  const std::string name_;
  const std::vector<LayerSpec> layers_;
  const WeightLayout layout_;
  const std::unique_ptr<gpu::HostBuffer> buffer_;
};

// Thread-safe. `*device` must outlive the store.
class WeightStore {
 public:
  // Models larger than `max_model_bytes` (the arena's data capacity) are refused.
  WeightStore(gpu::Device* device, uint64_t max_model_bytes)
      : device_(device), max_model_bytes_(max_model_bytes) {}
  WeightStore(const WeightStore&) = delete;
  WeightStore& operator=(const WeightStore&) = delete;

  // Copies `model` into a new pinned buffer. InvalidArgument (empty name, no layers, empty or
  // duplicate tensor name), AlreadyExists (name taken), ResourceExhausted (does not fit the
  // arena). On error nothing is registered.
  absl::StatusOr<const StoredModel*> Register(const ModelBytes& model);
  // NotFound naming the model. The pointer stays valid until Remove.
  absl::StatusOr<const StoredModel*> Find(absl::string_view name) const;
  absl::Status Remove(absl::string_view name);
  std::vector<std::string> Names() const;

 private:
  gpu::Device* const device_;
  const uint64_t max_model_bytes_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<StoredModel>, std::less<>> models_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pswitch::memdaemon

#endif  // PSWITCH_MEMDAEMON_WEIGHT_STORE_H_
