// pswitchd's request to an inspector child (registry/inspection_child.h) over the child's request
// socket (SOCK_SEQPACKET): the request as JSON, the archive's and the checkpoint's sealed memory
// files as passed descriptors. The child may have been started long before, waiting with its
// libraries loaded (a standby): the request is what makes it one registration's inspector.
//
// No libtorch: pswitchd sends, pswitch-worker receives.
#ifndef PSWITCH_MODELS_INSPECTION_WIRE_H_
#define PSWITCH_MODELS_INSPECTION_WIRE_H_

#include <cstddef>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "models/model_facts.h"

namespace pswitch::models {

// Sends `request` with its archive_fd and weights_fd (those >= 0). FailedPrecondition when the
// child has gone.
absl::Status SendInspectionRequest(int socket_fd, const InspectionRequest& request);

// A request as the child received it: `request`'s descriptors are `archive` and `weights`.
struct ReceivedInspection {
  InspectionRequest request;
  UniqueFd archive;
  UniqueFd weights;
};

// The child's report of its progress, on the same socket: sent without waiting, and dropped
// when the socket's buffer is full (pswitchd reads them every 10 ms).
void SendInspectionProgress(int socket_fd, const InspectionProgress& progress);

// The reports waiting on the socket, without blocking, each valid one to `told` in order; a
// malformed one is dropped (a child a hostile archive took over may send anything) and so are
// descriptors sent with it. At most `max_reports` per call. Returns how many were read.
size_t DrainInspectionProgress(int socket_fd,
                               const std::function<void(const InspectionProgress&)>& told,
                               size_t max_reports = 64);

// Waits for one request. Cancelled when pswitchd closed the socket first (the standby is not
// needed any more); InvalidArgument for a malformed request or descriptors that do not match it.
absl::StatusOr<ReceivedInspection> ReceiveInspectionRequest(int socket_fd);

}  // namespace pswitch::models

#endif  // PSWITCH_MODELS_INSPECTION_WIRE_H_
