#include "base/mapped_file.h"

#include <sys/mman.h>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status.h"

namespace pswitch::base {

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::MapSealed(const UniqueFd& fd,
                                                                        absl::string_view what,
                                                                        uint64_t max_bytes) {
  PSWITCH_ASSIGN_OR_RETURN(const uint64_t size, CheckSealedMemoryFile(fd, what, max_bytes));
  if (size == 0) return std::shared_ptr<const MappedFile>(new MappedFile(nullptr, 0));
  void* data = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (data == MAP_FAILED) return ErrnoStatus(absl::StrCat("mapping ", what));
  return std::shared_ptr<const MappedFile>(new MappedFile(data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<void*>(data_), size_);
}

}  // namespace pswitch::base
