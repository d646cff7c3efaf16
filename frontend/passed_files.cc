#include "frontend/passed_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/files.h"
#include "base/status.h"
#include "models/model_source.h"
#include "models/safetensors.h"

namespace pswitch::frontend {
namespace {

// As the catalog bounds files it reads by path (controller/model_catalog.cc).
constexpr uint64_t kMaxPlanBytes = 16 << 20;
constexpr uint64_t kMaxArchiveBytes = 64ull << 30;

}  // namespace

absl::Status CheckPassedInput(int fd, absl::string_view what, uint64_t max_bytes) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(absl::StrCat("stat ", what));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a regular file"));
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", st.st_size, " bytes; at most ", max_bytes, " are read"));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return ErrnoStatus(absl::StrCat("fcntl ", what));
  // O_PATH descriptors carry no read right; a write-only one is not the client's to read.
  if ((flags & O_PATH) != 0 || (flags & O_ACCMODE) == O_WRONLY) {
    return absl::InvalidArgumentError(absl::StrCat(what, " was not opened for reading"));
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> SealPassedFile(const UniqueFd& fd, absl::string_view what,
                                        uint64_t max_bytes) {
  PSWITCH_RETURN_IF_ERROR(CheckPassedInput(fd.get(), what, max_bytes));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(absl::StrCat("stat ", what));
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  const absl::Time deadline = absl::Now() + base::kFileIoTimeout;
  size_t done = 0;
  while (done < bytes.size()) {
    // A file on a slow or hostile file system must not hold the registration thread for ever.
    if (done > 0 && absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("reading ", what, " took longer than ",
                                                      absl::FormatDuration(base::kFileIoTimeout)));
    }
    const ssize_t n = ::pread(fd.get(), bytes.data() + done,
                              std::min<size_t>(bytes.size() - done, base::kFileIoChunkBytes),
                              static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(absl::StrCat("read ", what));
    if (n == 0) break;  // it shrank meanwhile: what was there is what it holds
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return base::SealedMemoryFile("pswitch-passed-file", bytes);
}

absl::StatusOr<RegistrationFiles> SortRegistrationFiles(
    const flatbuffers::Vector<proto::FileRole>* roles, std::vector<UniqueFd> fds) {
  const size_t declared = roles != nullptr ? roles->size() : 0;
  if (declared != fds.size()) {
    return absl::InvalidArgumentError(absl::StrCat("passed_files names ", declared, " files; ",
                                                   fds.size(), " came with the frame"));
  }
  RegistrationFiles files;
  for (size_t i = 0; i < declared; ++i) {
    UniqueFd* slot = nullptr;
    switch (roles->Get(static_cast<flatbuffers::uoffset_t>(i))) {
      case proto::FileRole::Weights:
        slot = &files.weights;
        break;
      case proto::FileRole::Archive:
        slot = &files.archive;
        break;
      case proto::FileRole::Plan:
        slot = &files.plan;
        break;
      default:
        return absl::InvalidArgumentError(
            "a registration takes weights, archive and plan files only");
    }
    if (slot->valid()) {
      return absl::InvalidArgumentError("passed_files names one role twice");
    }
    *slot = std::move(fds[i]);
  }
  return files;
}

absl::Status AttachRegistrationFiles(RegistrationFiles files, controller::ModelRequest* request) {
  if (files.archive.valid()) {
    if (!request->zoo_model.empty() && request->zoo_model != models::kScriptArchitecture) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", request->name, "': name an architecture or pass an archive, not both"));
    }
    PSWITCH_ASSIGN_OR_RETURN(UniqueFd sealed,
                             SealPassedFile(files.archive, "the passed archive", kMaxArchiveBytes));
    request->zoo_model = models::kScriptArchitecture;
    request->archive_fd = std::make_shared<const UniqueFd>(std::move(sealed));
    request->archive_path.clear();
  }
  if (files.weights.valid()) {
    PSWITCH_ASSIGN_OR_RETURN(UniqueFd sealed,
                             SealPassedFile(files.weights, "the passed weights file",
                                            models::SafetensorsLimits{}.max_file_bytes));
    request->weights_fd = std::make_shared<const UniqueFd>(std::move(sealed));
    request->weights_path = "(passed weights file)";
  }
  if (files.plan.valid()) {
    PSWITCH_ASSIGN_OR_RETURN(UniqueFd sealed,
                             SealPassedFile(files.plan, "the passed plan file", kMaxPlanBytes));
    request->plan_fd = std::make_shared<const UniqueFd>(std::move(sealed));
    request->plan = "(passed plan file)";
  }
  return absl::OkStatus();
}

}  // namespace pswitch::frontend
