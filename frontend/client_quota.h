// How many tasks each client may have unfinished at once (queued or running), so one client
// cannot fill a GPU's queue for everyone else. A client is its token's name, or, without
// tokens, its address. Thread-safe: tasks finish on scheduler threads.
#ifndef PSWITCH_FRONTEND_CLIENT_QUOTA_H_
#define PSWITCH_FRONTEND_CLIENT_QUOTA_H_

#include <cstddef>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace pswitch::frontend {

class ClientQuota {
 public:
  explicit ClientQuota(size_t max_per_client) : max_per_client_(max_per_client) {}
  // Counts one more unfinished task for `client`; ResourceExhausted (nothing counted) at the cap.
  absl::Status Admit(const std::string& client);
  // One of `client`'s admitted tasks finished (or was never queued).
  void Done(const std::string& client);
  size_t unfinished(const std::string& client) const;

 private:
  const size_t max_per_client_;
  mutable absl::Mutex mu_;
  std::map<std::string, size_t> unfinished_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_CLIENT_QUOTA_H_
