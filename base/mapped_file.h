// A read-only mapping of a sealed memory file: its bytes without a copy. Sealed against
// shrinking, growing and writing (checked first), the file cannot change or fault under the
// mapping, whoever else holds it.
#ifndef PSWITCH_BASE_MAPPED_FILE_H_
#define PSWITCH_BASE_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/unique_fd.h"

namespace pswitch::base {

class MappedFile {
 public:
  // `fd` mapped read-only: InvalidArgument naming `what` unless it is a sealed memory file of at
  // most `max_bytes` (base::CheckSealedMemoryFile). The mapping holds its own reference to the
  // file: `fd` may be closed.
  static absl::StatusOr<std::shared_ptr<const MappedFile>> MapSealed(const UniqueFd& fd,
                                                                     absl::string_view what,
                                                                     uint64_t max_bytes);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  absl::string_view bytes() const {
    return absl::string_view(static_cast<const char*>(data_), size_);
  }

 private:
  MappedFile(const void* data, size_t size) : data_(data), size_(size) {}
  const void* const data_;  // null for an empty file
  const size_t size_;
};

}  // namespace pswitch::base

#endif  // PSWITCH_BASE_MAPPED_FILE_H_
