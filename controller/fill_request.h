// A client's fill job as pswitchd's fill manager takes it (validated: frontend/requests.h).
#ifndef PSWITCH_CONTROLLER_FILL_REQUEST_H_
#define PSWITCH_CONTROLLER_FILL_REQUEST_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "api/types.h"
#include "base/unique_fd.h"
#include "registry/model_entry.h"

namespace pswitch::controller {

using api::FillKind;

using registry::kFillModelPrefix;

struct FillRequest {
  FillKind kind = FillKind::kSynthetic;
  std::string model;         // zoo model (inference, training)
  // Inference: safetensors with "input" rows, and where "output" goes when the job ends: names
  // under pswitchd's --data-root, or (passed by fd over the Unix socket, docs/dataplane.md) the
  // client's open files, and then the names only label them in messages. The dataset fd is
  // read, never written; the output fd is written from offset 0 and truncated to the output.
  std::string dataset_path;
  std::string output_path;
  std::shared_ptr<const UniqueFd> dataset_fd;
  std::shared_ptr<const UniqueFd> output_fd;
  uint32_t batch = 1;
  int64_t steps = 0;  // training iterations / synthetic steps (inference: from the dataset)
  uint64_t seed = 0;
  absl::Duration step;  // profiled step duration
  uint64_t memory_bytes = 0;
  std::optional<absl::Duration> deadline;  // from submission
  absl::Duration synthetic_step;
  uint64_t synthetic_alloc_bytes = 0;
  bool ignore_pause = false;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_FILL_REQUEST_H_
