// The deterministic weight layout shared by the memdaemon and every worker.
//
// A model's tensors are placed in execution order (layer by layer, tensor by tensor), each at
// the next multiple of the alignment. The memdaemon lays out its pinned host copy with this
// function and the worker builds its tensor views with the same function, so the only number
// that crosses the process boundary is the base offset of the model's region in the arena.
#ifndef PSWITCH_MEMDAEMON_WEIGHT_LAYOUT_H_
#define PSWITCH_MEMDAEMON_WEIGHT_LAYOUT_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pswitch::memdaemon {

inline constexpr uint64_t kWeightAlignmentBytes = 256;

struct TensorSpec {
  std::string name;
  uint64_t bytes = 0;
};

struct LayerSpec {
  std::string name;
  std::vector<TensorSpec> tensors;
};

struct TensorPlacement {
  uint64_t offset = 0;  // from the start of the model's region
  uint64_t bytes = 0;
};

struct WeightLayout {
  // placements[l][t] is tensor t of layer l.
  std::vector<std::vector<TensorPlacement>> placements;
  // Byte range [layer_begin[l], layer_end[l]) covering layer l's tensors (empty if none).
  std::vector<uint64_t> layer_begin;
  std::vector<uint64_t> layer_end;
  uint64_t total_bytes = 0;
};

// Lays out `layers` in order at `alignment` (a power of two). InvalidArgument for a bad
// alignment, OutOfRange if the total overflows 64 bits.
absl::StatusOr<WeightLayout> ComputeWeightLayout(std::span<const LayerSpec> layers,
                                                 uint64_t alignment = kWeightAlignmentBytes);

// Rounds `value` up to a multiple of `alignment` (a power of two); false on overflow.
bool AlignUp(uint64_t value, uint64_t alignment, uint64_t* out);

}  // namespace pswitch::memdaemon

#endif  // PSWITCH_MEMDAEMON_WEIGHT_LAYOUT_H_
