// Triton's shared-memory extensions (system and CUDA) as the HTTP port serves them: who may map
// which segment, and the registered regions per principal (docs/dataplane.md).
//
// pswitchd runs as a privileged service, so a segment named by a client is mapped only if the
// client could map it itself: a regular file directly under the shared-memory directory
// (/dev/shm), opened without following links, owned by the caller's uid (the uid its token
// names, or on loopback without a token the uid that owns its socket), never another user's,
// root's included. A segment that is missing, not a regular file, a link, or another user's gets
// one answer (the same status and message), so no one learns which names exist.
#ifndef PSWITCH_FRONTEND_TRITON_SHM_H_
#define PSWITCH_FRONTEND_TRITON_SHM_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "base/unique_fd.h"
#include "dataplane/region_table.h"
#include "frontend/kserve_codec.h"
#include "proto/host_tensor.h"

namespace pswitch::frontend {

// The segment `key` ("/name", as shm_open takes it) under the directory `shm_dir_fd`, opened
// read-write with O_NOFOLLOW|O_CLOEXEC|O_NONBLOCK, if it is a regular file owned by `owner_uid`.
// InvalidArgument for a malformed key (empty, ".", "..", a '/' after the first, a NUL, too
// long); NotFound, with one message whatever the reason, for everything else.
absl::StatusOr<UniqueFd> OpenShmSegment(int shm_dir_fd, absl::string_view key, uid_t owner_uid);

// A Triton region name: text of 1..128 bytes. InvalidArgument otherwise.
absl::Status CheckRegionName(absl::string_view name);

// Turns `request`'s shared-memory inputs into Place::Region slices of `owner`'s registered
// regions (named in the request, by id from here on) and its shared-memory output into
// `*outputs_to`; the regions they lie in are appended to `*regions`, each once. NotFound for a
// region `owner` has not registered (another's included), OutOfRange for a slice outside its
// region (or its file as it is now), InvalidArgument for more than one output in shared memory
// (a pswitch model has one output).
absl::Status PlaceInRegions(const dataplane::RegionTable& table, const std::string& owner,
                            InferRequest& request,
                            std::vector<std::shared_ptr<const dataplane::TransferRegion>>* regions,
                            std::optional<proto::ByteSlice>* outputs_to);

struct SystemRegionStatus {
  std::string name;
  std::string key;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};
struct CudaRegionStatus {
  std::string name;
  int device = 0;
  uint64_t bytes = 0;
};

// Registers and lists Triton regions in the RegionTable every port shares, keeping what Triton's
// status answers name that a TransferRegion does not hold (a system region's key). Thread-safe.
// `*table` must outlive it.
class TritonRegions {
 public:
  // `shm_dir`: where keys are looked up ("/dev/shm"; a test's own directory in tests).
  explicit TritonRegions(dataplane::RegionTable* table, std::string shm_dir = "/dev/shm")
      : table_(table), shm_dir_(std::move(shm_dir)) {}
  TritonRegions(const TritonRegions&) = delete;
  TritonRegions& operator=(const TritonRegions&) = delete;

  // Maps [offset, offset + bytes) of segment `key` for `owner` as region `name`. `uid`: the uid
  // the caller is on this machine; nullopt (a token without a UID column, a remote client) is
  // PermissionDenied. Errors: OpenShmSegment's, TransferRegion::FromShmFile's (the range must
  // lie in the file), RegionTable::Add's (AlreadyExists, ResourceExhausted).
  absl::Status RegisterSystem(const std::string& owner, std::optional<uid_t> uid,
                              const std::string& name, const std::string& key, uint64_t offset,
                              uint64_t bytes);
  // A client's CUDA allocation (its 64-byte IPC handle) on `device`.
  absl::Status RegisterCuda(const std::string& owner, const std::string& name,
                            std::string ipc_handle, int device, uint64_t bytes);
  // Removes `owner`'s region `name` of `kind`, or (name empty) all its regions of that kind.
  // A name it has not registered is no error (as Triton answers).
  absl::Status Unregister(const std::string& owner, dataplane::RegionKind kind,
                          const std::string& name);
  // `owner`'s regions, or (name given) the one; NotFound as Unregister.
  absl::StatusOr<std::vector<SystemRegionStatus>> SystemStatus(const std::string& owner,
                                                               const std::string& name) const;
  absl::StatusOr<std::vector<CudaRegionStatus>> CudaStatus(const std::string& owner,
                                                           const std::string& name) const;

 private:
  // The owner's regions of `kind`, or the one named; NotFound for a name it has not (of kind).
  absl::StatusOr<std::vector<dataplane::RegisteredRegion>> Select(const std::string& owner,
                                                                  dataplane::RegionKind kind,
                                                                  const std::string& name) const;

  dataplane::RegionTable* const table_;
  const std::string shm_dir_;
  // Registration and removal hold it so a region and its key come and go together.
  mutable absl::Mutex mu_;
  std::map<uint64_t, std::string> keys_ ABSL_GUARDED_BY(mu_);  // system regions' keys, by id
};

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_TRITON_SHM_H_
