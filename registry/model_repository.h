// The models an operator put on this node (--model-repository DIR), kept as inference servers
// keep them: one folder per model, named as the model, holding a config.json and the files it
// names, relative to the folder:
//
//   {"architecture": "resnet50", "weights": "weights.safetensors", "batch": 8, "plan": "auto"}
//
// ("weights" optional: seeded random weights; "plan": "auto" or a find-grouping plan file;
// "trainers": ["alice", ...] optional, the token names who may train and unload it besides
// admins — everyone else trains a copy of their own).
// Clients name models; only the repository names files, and every one resolves inside the
// model's folder (base::ConfinedDir: no symlink followed, no "..").
#ifndef PSWITCH_REGISTRY_MODEL_REPOSITORY_H_
#define PSWITCH_REGISTRY_MODEL_REPOSITORY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/confined_dir.h"
#include "registry/model_catalog.h"

namespace pswitch::registry {

// Thread-safe (const).
class ModelRepository {
 public:
  static absl::StatusOr<ModelRepository> Open(const std::string& dir);

  // The models in it: folders with a config.json, sorted by name.
  absl::StatusOr<std::vector<std::string>> Index() const;
  // The registration of `name` as its config says. NotFound when it has no folder;
  // InvalidArgument naming the field for a bad config.
  absl::StatusOr<ModelRequest> Request(const std::string& name) const {
    return Request(name, nullptr);
  }
  // The same with `*config_text` (untrusted JSON, the same fields) in place of the folder's
  // config.json (Triton's load with a config); the files it names resolve in the folder alike.
  absl::StatusOr<ModelRequest> Request(const std::string& name,
                                       const std::string* config_text) const;

 private:
  explicit ModelRepository(base::ConfinedDir root) : root_(std::move(root)) {}
  base::ConfinedDir root_;
};

// A client's registration as this pswitchd allows it. A request naming only a model is loaded
// from `repository` (NotFound without one, or when it lacks the model). One naming files on the
// server is refused (PermissionDenied) unless `allow_client_paths`, and then its paths must be
// absolute. An architecture with seeded random weights is always allowed.
absl::StatusOr<ModelRequest> ResolveModelRequest(ModelRequest from_client,
                                                 const ModelRepository* repository,
                                                 bool allow_client_paths);

}  // namespace pswitch::registry

#endif  // PSWITCH_REGISTRY_MODEL_REPOSITORY_H_
