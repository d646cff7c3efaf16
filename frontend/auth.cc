#include "frontend/auth.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/files.h"
#include "base/status.h"

namespace pswitch::frontend {
namespace {

constexpr size_t kMinTokenLength = 16;

// Equal-length contents compared without an early exit.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

}  // namespace

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  const std::string what = absl::StrCat("token file '", path, "'");
  PSWITCH_ASSIGN_OR_RETURN(UniqueFd fd, base::OpenRegularFile(AT_FDCWD, path, what, 1 << 20));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(absl::StrCat("stat ", what));
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is readable or writable by others: make it 0600 (or 0400)"));
  }
  PSWITCH_ASSIGN_OR_RETURN(std::string text, base::ReadAll(fd, what, 1 << 20));
  std::vector<TokenEntry> tokens;
  std::set<std::string> seen;
  std::set<uid_t> seen_uids;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    std::vector<std::string> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat(what, " line ", line_number);
    if (fields.size() != 3 && fields.size() != 4) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": want TOKEN NAME ROLE [UID]"));
    }
    if (fields[0].size() < kMinTokenLength) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tokens need at least ", kMinTokenLength, " characters"));
    }
    if (!seen.insert(fields[0]).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": this token is listed twice"));
    }
    Principal principal;
    principal.name = fields[1];
    if (fields[2] == "admin") {
      principal.role = Role::kAdmin;
    } else if (fields[2] == "user") {
      principal.role = Role::kUser;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(where, ": role must be admin or user"));
    }
    std::optional<uid_t> uid;
    if (fields.size() == 4) {
      uint32_t parsed = 0;
      // (uid_t)-1 is "no uid" to the kernel's chown and setresuid: never a peer's.
      if (!absl::SimpleAtoi(fields[3], &parsed) || fields[3].front() == '-' ||
          fields[3].front() == '+' || parsed == static_cast<uint32_t>(-1)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": UID must be a decimal uid, got '", fields[3], "'"));
      }
      if (!seen_uids.insert(parsed).second) {
        // Two principals for one uid would make the peer's identity depend on line order.
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": uid ", parsed, " is already mapped by another line"));
      }
      uid = static_cast<uid_t>(parsed);
    }
    tokens.push_back(TokenEntry{fields[0], std::move(principal), uid});
  }
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " lists no token"));
  return TokenTable(std::move(tokens));
}

std::optional<Principal> TokenTable::Find(absl::string_view token) const {
  std::optional<Principal> found;
  // Every entry is compared, matched or not.
  for (const TokenEntry& entry : entries_) {
    if (ConstantTimeEquals(entry.token, token) && !found) found = entry.principal;
  }
  return found;
}

std::optional<uid_t> TokenTable::FindTokenUid(absl::string_view token) const {
  std::optional<uid_t> found;
  bool matched = false;
  for (const TokenEntry& entry : entries_) {
    if (ConstantTimeEquals(entry.token, token) && !matched) {
      matched = true;
      found = entry.uid;
    }
  }
  return found;
}

std::optional<Principal> TokenTable::FindUid(uid_t uid) const {
  for (const TokenEntry& entry : entries_) {
    if (entry.uid == uid) return entry.principal;
  }
  return std::nullopt;
}

bool RoleAllows(Role role, proto::ClientRequestBody type) {
  if (role == Role::kAdmin) return true;
  switch (type) {
    case proto::ClientRequestBody::SubmitTask:
    case proto::ClientRequestBody::QueryTask:
    case proto::ClientRequestBody::CancelTask:
    case proto::ClientRequestBody::ListModels:
    case proto::ClientRequestBody::ListTasks:
    case proto::ClientRequestBody::Authenticate:
    // Their own transfer areas (Unix socket), bounded per principal by the RegionTable.
    case proto::ClientRequestBody::RegisterArea:
    case proto::ClientRequestBody::ReleaseArea:
    // Which models a user may unload is the model's to say (TaskAdmission::CheckUnload).
    case proto::ClientRequestBody::UnloadModel:
      return true;
    default:
      return false;
  }
}

void TaskOwners::Record(uint64_t task, const std::string& owner) {
  absl::MutexLock lock(&mu_);
  owners_[task] = owner;
  while (owners_.size() > max_entries_) owners_.erase(owners_.begin());  // ids grow: oldest first
}

bool TaskOwners::MayAccess(const Principal& principal, uint64_t task) const {
  if (principal.role == Role::kAdmin) return true;
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(task);
  return it != owners_.end() && it->second == principal.name;
}

}  // namespace pswitch::frontend
