// A dataset-inference fill job's dataset as pswitchd holds it, and where the job's output goes.
//
// pswitchd never hands a worker a path: whether a client passed its dataset by fd (Unix socket)
// or named it under --data-root (TCP), pswitchd copies the file once, in the kernel, into a
// sealed memory file of its own (base::SealedCopyOfFile), parses that copy as safetensors within
// the limits, and lends it to the job's workers as a transfer region (docs/dataplane.md); each
// Run names the "input" rows as a Place::Region slice of it. The client's file may then change,
// shrink or vanish: neither pswitchd nor a worker reads it again.
#ifndef PSWITCH_CONTROLLER_FILL_DATASET_H_
#define PSWITCH_CONTROLLER_FILL_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dataplane/transfer_region.h"
#include "proto/host_tensor.h"
#include "registry/model_catalog.h"

namespace pswitch::controller {

// Immutable once loaded: thread-safe. Holding it keeps the region (its memory) alive.
struct FillDataset {
  std::shared_ptr<const dataplane::TransferRegion> region;  // the sealed copy, whole
  proto::HostTensor rows;  // "input": a Place::Region slice of `region`, its dtype and shape
  int64_t num_rows = 0;    // rows.shape[0], at least 1
};

// Copies regular file `source` (opened for reading; at most `max_bytes`) into a sealed memory
// file, parses it as safetensors (models::SafetensorsLimits, files of at most `max_bytes`) and
// describes its "input" tensor. InvalidArgument naming `name` (how messages call the dataset) for
// a file of another kind, one too large, one that is not safetensors, or one without an "input"
// of at least one row of a dtype tensors have on the wire (proto/dtype.h), or one on a network or
// FUSE file system (base::CheckLocalFile); DeadlineExceeded for a copy that takes too long. Reads a
// file: call it off every event loop.
absl::StatusOr<std::shared_ptr<const FillDataset>> LoadFillDataset(int source,
                                                                   absl::string_view name,
                                                                   uint64_t max_bytes);

// InvalidArgument naming the model unless `dataset`'s rows fit `model`'s recorded input: its
// dtype (int32 rows for an int64 input too), its rank, and, for a floating-point input (images,
// features), each dimension after the batch. Token inputs (integers) may have any length.
absl::Status CheckDatasetFitsModel(const FillDataset& dataset, const registry::CatalogEntry& model);

// Writes `bytes` into the client's output file `fd` from offset 0 (pwrite: the client's offset
// neither steers nor moves) and truncates it there. `what` names it in errors.
absl::Status WriteOutputFile(int fd, absl::string_view bytes, absl::string_view what);

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_FILL_DATASET_H_
