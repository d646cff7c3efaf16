#include "memdaemon/weight_layout.h"

#include "absl/strings/str_cat.h"

namespace pswitch::memdaemon {

bool AlignUp(uint64_t value, uint64_t alignment, uint64_t* out) {
  uint64_t bumped = value + (alignment - 1);
  if (bumped < value) return false;
  *out = bumped & ~(alignment - 1);
  return true;
}

absl::StatusOr<WeightLayout> ComputeWeightLayout(std::span<const LayerSpec> layers,
                                                 uint64_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("alignment ", alignment, " is not a power of two"));
  }
  WeightLayout layout;
  layout.placements.resize(layers.size());
  layout.layer_begin.resize(layers.size());
  layout.layer_end.resize(layers.size());
  uint64_t cursor = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    layout.layer_begin[l] = cursor;
    for (const TensorSpec& tensor : layers[l].tensors) {
      uint64_t offset;
      if (!AlignUp(cursor, alignment, &offset) || tensor.bytes > UINT64_MAX - offset) {
        return absl::OutOfRangeError(absl::StrCat("layer ", l, " '", layers[l].name, "' tensor '",
                                                  tensor.name, "': layout overflows 64 bits"));
      }
      if (layout.placements[l].empty()) layout.layer_begin[l] = offset;
      layout.placements[l].push_back(TensorPlacement{offset, tensor.bytes});
      cursor = offset + tensor.bytes;
    }
    layout.layer_end[l] = layout.placements[l].empty() ? layout.layer_begin[l] : cursor;
  }
  if (!AlignUp(cursor, alignment, &layout.total_bytes)) {
    return absl::OutOfRangeError("layout overflows 64 bits");
  }
  return layout;
}

}  // namespace pswitch::memdaemon
