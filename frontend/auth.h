// Who may do what on pswitchd's client port. Operators give each client a bearer token in a file
// (--auth-tokens FILE, lines "TOKEN NAME ROLE [UID]"); a connection presents its token in its first
// frame (Authenticate). The optional UID maps a local uid to that line's principal for the peers
// the kernel names (the Unix socket, loopback TCP and HTTP: frontend/peer_identity.h). Roles:
//   admin: everything (register models, bubble instructions and cycles, fill jobs, any task);
//   user:  inference on the models it may see, training (in place only where the model's
//          configuration names it a trainer, else of a copy of its own), unloading the models it
//          may change, and the status and cancel of its own tasks (frontend/admission.h).
// Tokens are compared in constant time; a file others can read is refused.
#ifndef PSWITCH_FRONTEND_AUTH_H_
#define PSWITCH_FRONTEND_AUTH_H_

#include <sys/types.h>

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

// One line of the token file: its principal and, where the operator gave one, the local uid that
// is that principal without presenting the token.
struct TokenEntry {
  std::string token;
  Principal principal;
  std::optional<uid_t> uid;
};

// Immutable after Load: thread-safe.
class TokenTable {
 public:
  // Lines "TOKEN NAME ROLE [UID]" ('#' comments, blank lines skipped); tokens of at least 16
  // characters, unique; role admin or user; UID a decimal uid listed on one line at most.
  // FailedPrecondition for a file group or others can read or write, InvalidArgument naming the
  // line for a bad one (never echoing a token).
  static absl::StatusOr<TokenTable> Load(const std::string& path);
  static TokenTable ForTest(std::vector<std::pair<std::string, Principal>> tokens) {
    std::vector<TokenEntry> entries;
    for (auto& [token, principal] : tokens) {
      entries.push_back(TokenEntry{std::move(token), std::move(principal), std::nullopt});
    }
    return TokenTable(std::move(entries));
  }
  static TokenTable ForTestEntries(std::vector<TokenEntry> entries) {
    return TokenTable(std::move(entries));
  }

  // The token's principal, or nullopt. Takes the same time whichever token (if any) matches.
  std::optional<Principal> Find(absl::string_view token) const;
  // The principal of the line whose UID column is `uid`, or nullopt.
  std::optional<Principal> FindUid(uid_t uid) const;
  // The UID column of the token's line, or nullopt (no such token, or no UID given). Constant
  // time as Find.
  std::optional<uid_t> FindTokenUid(absl::string_view token) const;
  size_t size() const { return entries_.size(); }

 private:
  explicit TokenTable(std::vector<TokenEntry> entries) : entries_(std::move(entries)) {}
  std::vector<TokenEntry> entries_;
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
