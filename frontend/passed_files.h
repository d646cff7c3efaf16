// Files a client opened itself and passed by fd over the Unix socket (ClientRequest.passed_files,
// docs/dataplane.md), so pswitchd never opens a path a client names with its own privileges:
// holding the fd is the proof the client may read it. Everything about such a file is hostile:
// it may be a FIFO or a device, open for writing only, huge, or shrinking as it is read, and the
// client shares its file offset. Nothing here blocks on one, follows its offset, or reads past a
// bound.
#ifndef PSWITCH_FRONTEND_PASSED_FILES_H_
#define PSWITCH_FRONTEND_PASSED_FILES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/unique_fd.h"
#include "controller/fill_request.h"
#include "proto/client_generated.h"
#include "registry/model_catalog.h"

namespace pswitch::frontend {

// InvalidArgument naming `what` unless `fd` is a regular file of at most `max_bytes` that was
// opened for reading.
absl::Status CheckPassedInput(int fd, absl::string_view what, uint64_t max_bytes);

// The passed file's bytes (checked as CheckPassedInput checks; copied by the kernel from offset 0,
// so the client's offset neither steers nor is moved: base::SealedCopyOfFile) in a sealed memory
// file of pswitchd's own, which the file's later changes cannot reach.
absl::StatusOr<UniqueFd> SealPassedFile(const UniqueFd& fd, absl::string_view what,
                                        uint64_t max_bytes);

// InvalidArgument naming `what` unless `fd` is a regular file opened for writing, not to append
// (pwrite would append) and not sealed against writing: where a fill job's output goes.
absl::Status CheckPassedOutput(int fd, absl::string_view what);

// The files of a registration, by role (FileRole Weights, Archive, Plan), each at most once.
// InvalidArgument for another role, a role given twice, or a count unlike the fds'.
struct RegistrationFiles {
  UniqueFd weights;
  UniqueFd archive;
  UniqueFd plan;
};
absl::StatusOr<RegistrationFiles> SortRegistrationFiles(
    const flatbuffers::Vector<proto::FileRole>* roles, std::vector<UniqueFd> fds);

// Puts `files` in `*request` in place of its paths: each is copied (SealPassedFile, bounded as
// the catalog bounds that kind) and its path becomes only its name in messages. Runs on the
// registration thread (it reads files). An archive passed without an architecture makes the
// model a script model.
absl::Status AttachRegistrationFiles(RegistrationFiles files, registry::ModelRequest* request);

// The files of a fill job (FillSubmit, FillEstimateQuery), by role (FileRole Dataset, Output),
// each at most once; InvalidArgument as SortRegistrationFiles.
struct FillFiles {
  UniqueFd dataset;
  UniqueFd output;
};
absl::StatusOr<FillFiles> SortFillFiles(const flatbuffers::Vector<proto::FileRole>* roles,
                                        std::vector<UniqueFd> fds);

// Checks `files` (the dataset CheckPassedInput, the output CheckPassedOutput; both cheap: fstat
// and fcntl, nothing read) and puts them in `*request` in place of its paths, which become only
// names in messages. The dataset is copied and bounded later, on the fill manager's I/O thread.
absl::Status AttachFillFiles(FillFiles files, controller::FillRequest* request);

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_PASSED_FILES_H_
