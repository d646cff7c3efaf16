// Who may do what on pswitchd's client port. Operators give each client a bearer token in a file
// (--auth-tokens FILE, lines "TOKEN NAME ROLE"); a connection presents its token in its first
// frame (Authenticate). Roles:
//   admin: everything (register models, bubble instructions and cycles, fill jobs, any task);
//   user:  inference on the models it may see, training (in place only where the model's
//          configuration names it a trainer, else of a copy of its own), unloading the models it
//          may change, and the status and cancel of its own tasks (frontend/admission.h).
// Tokens are compared in constant time; a file others can read is refused.
#ifndef PSWITCH_FRONTEND_AUTH_H_
#define PSWITCH_FRONTEND_AUTH_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/client_generated.h"

namespace pswitch::frontend {

enum class Role { kUser, kAdmin };

struct Principal {
  std::string name;
  Role role = Role::kUser;
};

// Immutable after Load: thread-safe.
class TokenTable {
 public:
  // Lines "TOKEN NAME ROLE" ('#' comments, blank lines skipped); tokens of at least 16
  // characters, unique; role admin or user. FailedPrecondition for a file group or others can
  // read or write, InvalidArgument naming the line for a bad one (never echoing a token).
  static absl::StatusOr<TokenTable> Load(const std::string& path);
  static TokenTable ForTest(std::vector<std::pair<std::string, Principal>> tokens) {
    return TokenTable(std::move(tokens));
  }

  // The token's principal, or nullopt. Takes the same time whichever token (if any) matches.
  std::optional<Principal> Find(absl::string_view token) const;
  size_t size() const { return tokens_.size(); }

 private:
  explicit TokenTable(std::vector<std::pair<std::string, Principal>> tokens)
      : tokens_(std::move(tokens)) {}
  std::vector<std::pair<std::string, Principal>> tokens_;
};

// Whether `role` may send a request of `type`. Ownership of tasks is checked separately.
bool RoleAllows(Role role, proto::ClientRequestBody type);

// Which principal submitted each task, so a user sees and cancels only its own. Bounded: the
// oldest entries go first (a finished task's record outlives the registry's anyway). Thread-safe.
class TaskOwners {
 public:
  explicit TaskOwners(size_t max_entries = 1 << 16) : max_entries_(max_entries) {}
  void Record(uint64_t task, const std::string& owner);
  // Whether `principal` may see or cancel `task`: an admin always; a user its own tasks.
  bool MayAccess(const Principal& principal, uint64_t task) const;

 private:
  const size_t max_entries_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, std::string> owners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_AUTH_H_
