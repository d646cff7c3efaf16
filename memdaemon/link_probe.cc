#include "memdaemon/link_probe.h"

#include <algorithm>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::memdaemon {

absl::StatusOr<double> MeasureLinkBandwidth(MemDaemon& daemon, const LinkProbeOptions& options) {
  if (options.bytes == 0 || options.repeats < 1) {
    return absl::InvalidArgumentError("link probe: bytes and repeats must be positive");
  }
  PSWITCH_ASSIGN_OR_RETURN(Lease lease, daemon.leases().Acquire("link-probe", options.bytes));
  absl::Cleanup release = [&] {
    (void)daemon.leases().Release(lease.offset, "link-probe");
    // Epochs of the first switch start above 0: a probe value left behind would pass its gate.
    (void)daemon.ready_flags().Store(0, 0);
  };
  PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<gpu::HostBuffer> source,
                           daemon.device().AllocatePinned(options.bytes));
  std::vector<double> rates;
  for (int r = 0; r < options.repeats; ++r) {
    gpu::CopyJob job;
    job.epoch = static_cast<uint32_t>(r + 1);
    job.ready_flags = &daemon.ready_flags();
    job.ready_flag_base = 0;
    job.groups.push_back(gpu::CopyGroup{{gpu::CopySpan{source->data(), lease.offset, options.bytes}}});
    PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<gpu::CopyTicket> ticket,
                             daemon.copy_engine().Submit(std::move(job)));
    absl::StatusOr<std::vector<gpu::GroupTiming>> timings = ticket->Wait(options.timeout);
    if (!timings.ok()) {
      ticket->Cancel();
      // A copy still reading the buffer must not outlive it: past a second deadline the buffer
      // is leaked on purpose rather than freed under the copy.
      if (!ticket->Wait(options.timeout).ok() && !ticket->finished()) (void)source.release();
      return absl::Status(timings.status().code(),
                          absl::StrCat("link probe copy: ", timings.status().message()));
    }
    if (timings->size() != 1) {
      return absl::InternalError("link probe: the copy engine reported no single group");
    }
    const int64_t ns = timings->front().ready_ns - timings->front().copy_start_ns;
    if (ns <= 0) return absl::InternalError("link probe: the copy engine reported no duration");
    rates.push_back(static_cast<double>(options.bytes) * 1e9 / static_cast<double>(ns));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace pswitch::memdaemon
