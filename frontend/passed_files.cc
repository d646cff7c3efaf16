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

// As registration bounds files it reads by path (registry/registration_pipeline.cc).
constexpr uint64_t kMaxPlanBytes = 16 << 20;
constexpr uint64_t kMaxArchiveBytes = 64ull << 30;

}  // namespace

absl::Status CheckPassedInput(int fd, absl::string_view what, uint64_t max_bytes) {
  return base::CheckReadableRegularFile(fd, what, max_bytes).status();
}

absl::StatusOr<UniqueFd> SealPassedFile(const UniqueFd& fd, absl::string_view what,
                                        uint64_t max_bytes) {
  // Checked (base::CheckReadableRegularFile) and copied by the kernel, page by page, never whole
  // through a buffer of ours.
  return base::SealedCopyOfFile(fd.get(), what, max_bytes);
}

absl::Status CheckPassedOutput(int fd, absl::string_view what) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(absl::StrCat("stat ", what));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a regular file"));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return ErrnoStatus(absl::StrCat("fcntl ", what));
  if ((flags & O_PATH) != 0 || (flags & O_ACCMODE) == O_RDONLY) {
    return absl::InvalidArgumentError(absl::StrCat(what, " was not opened for writing"));
  }
  // pwrite on an O_APPEND file appends: the output would not be the file.
  if ((flags & O_APPEND) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " was opened to append (O_APPEND)"));
  }
  // Sealed against writes or resizing (a memfd): nothing could be written to it.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals > 0 && (seals & (F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE))) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is sealed against writing"));
  }
  return absl::OkStatus();
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

absl::StatusOr<FillFiles> SortFillFiles(const flatbuffers::Vector<proto::FileRole>* roles,
                                        std::vector<UniqueFd> fds) {
  const size_t declared = roles != nullptr ? roles->size() : 0;
  if (declared != fds.size()) {
    return absl::InvalidArgumentError(absl::StrCat("passed_files names ", declared, " files; ",
                                                   fds.size(), " came with the frame"));
  }
  FillFiles files;
  for (size_t i = 0; i < declared; ++i) {
    UniqueFd* slot = nullptr;
    switch (roles->Get(static_cast<flatbuffers::uoffset_t>(i))) {
      case proto::FileRole::Dataset:
        slot = &files.dataset;
        break;
      case proto::FileRole::Output:
        slot = &files.output;
        break;
      default:
        return absl::InvalidArgumentError("a fill job takes dataset and output files only");
    }
    if (slot->valid()) return absl::InvalidArgumentError("passed_files names one role twice");
    *slot = std::move(fds[i]);
  }
  return files;
}

absl::Status AttachFillFiles(FillFiles files, controller::FillRequest* request) {
  if (files.dataset.valid()) {
    // Its size is the fill manager's to bound (--max-dataset-bytes), as it copies it.
    PSWITCH_RETURN_IF_ERROR(
        CheckPassedInput(files.dataset.get(), "the passed dataset", UINT64_MAX));
    request->dataset_fd = std::make_shared<const UniqueFd>(std::move(files.dataset));
    request->dataset_path = "(passed dataset)";
  }
  if (files.output.valid()) {
    PSWITCH_RETURN_IF_ERROR(CheckPassedOutput(files.output.get(), "the passed output file"));
    request->output_fd = std::make_shared<const UniqueFd>(std::move(files.output));
    request->output_path = "(passed output file)";
  }
  return absl::OkStatus();
}

absl::Status AttachRegistrationFiles(RegistrationFiles files, registry::ModelRequest* request) {
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
