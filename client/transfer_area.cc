#include "client/transfer_area.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::client {
namespace {

// Rounds up to the alignment; false on overflow.
bool AlignUp(uint64_t bytes, uint64_t alignment, uint64_t* out) {
  if (bytes > UINT64_MAX - (alignment - 1)) return false;
  *out = (bytes + alignment - 1) / alignment * alignment;
  return true;
}

std::string Mib(uint64_t bytes) { return absl::StrCat(bytes >> 20, " MiB"); }

}  // namespace

absl::StatusOr<std::unique_ptr<TransferArea>> TransferArea::Create(uint64_t bytes,
                                                                   absl::string_view name) {
  if (bytes == 0 || bytes > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("transfer area of ", bytes, " bytes"));
  }
  UniqueFd fd(::memfd_create(std::string(name).c_str(), MFD_ALLOW_SEALING | MFD_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("memfd_create (transfer area)");
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus(absl::StrCat("ftruncate transfer area to ", bytes, " bytes"));
  }
  // pswitchd refuses an area that could shrink: a shrunk file would fault its workers' reads.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    return ErrnoStatus("F_ADD_SEALS F_SEAL_SHRINK (transfer area)");
  }
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (data == MAP_FAILED) return ErrnoStatus(absl::StrCat("mmap transfer area of ", bytes));
  return std::unique_ptr<TransferArea>(
      new TransferArea(std::move(fd), static_cast<uint8_t*>(data), bytes));
}

TransferArea::~TransferArea() { ::munmap(data_, bytes_); }

AreaSpan::~AreaSpan() { allocator_->Release(area_index_, offset_); }

std::shared_ptr<AreaAllocator> AreaAllocator::Create(AreaAllocatorOptions options,
                                                     AreaRegistrar registrar) {
  return std::shared_ptr<AreaAllocator>(new AreaAllocator(options, std::move(registrar)));
}

std::shared_ptr<AreaSpan> AreaAllocator::TryAllocateIn(size_t area_index, uint64_t reserved,
                                                       uint64_t bytes) {
  Area& area = areas_[area_index];
  for (auto it = area.free.begin(); it != area.free.end(); ++it) {
    if (it->second < reserved) continue;
    const uint64_t offset = it->first;
    const uint64_t left = it->second - reserved;
    area.free.erase(it);
    if (left > 0) area.free.emplace(offset + reserved, left);
    allocated_bytes_ += reserved;
    std::shared_ptr<AreaSpan> span(new AreaSpan(shared_from_this(), area_index, area.id, offset,
                                                bytes, area.mapping->data() + offset));
    area.live[offset] = {reserved, span};
    return span;
  }
  return nullptr;
}

std::shared_ptr<AreaSpan> AreaAllocator::TryAllocate(uint64_t reserved, uint64_t bytes) {
  for (size_t i = 0; i < areas_.size(); ++i) {
    if (std::shared_ptr<AreaSpan> span = TryAllocateIn(i, reserved, bytes)) return span;
  }
  return nullptr;
}

absl::StatusOr<std::shared_ptr<AreaSpan>> AreaAllocator::AddArea(uint64_t reserved, uint64_t bytes,
                                                                 bool take) {
  uint64_t area_bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return closed_;
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    uint64_t wanted = 0;
    if (!AlignUp(std::max(reserved, options_.first_area_bytes), page, &wanted)) {
      return absl::InvalidArgumentError(absl::StrCat("a span of ", bytes, " bytes"));
    }
    const uint64_t room =
        options_.max_total_bytes - std::min(options_.max_total_bytes, area_bytes_);
    if (areas_.size() >= options_.max_areas || room < reserved) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "transfer areas full: ", bytes, " bytes do not fit in the free space of ", areas_.size(),
          " areas (", Mib(area_bytes_), ", ", Mib(allocated_bytes_),
          " held by live tensors and results), and another area would pass the client's bound "
          "of ",
          options_.max_areas, " areas / ", Mib(options_.max_total_bytes),
          "; release results (or copy their outputs out) and area tensors no longer needed"));
    }
    // Take what the bound leaves rather than refuse a request that fits in it.
    area_bytes = std::max(std::min(wanted, room / page * page), reserved);
  }
  PSWITCH_ASSIGN_OR_RETURN(std::unique_ptr<TransferArea> mapping,
                           TransferArea::Create(area_bytes, "pswitch-area"));
  PSWITCH_ASSIGN_OR_RETURN(uint64_t id, registrar_(*mapping));
  absl::MutexLock lock(&mu_);
  Area area;
  area.id = id;
  area.free.emplace(0, mapping->bytes());
  area.mapping = std::move(mapping);
  area_bytes_ += area.mapping->bytes();
  areas_.push_back(std::move(area));
  if (!take) return std::shared_ptr<AreaSpan>();
  return TryAllocateIn(areas_.size() - 1, reserved, bytes);
}

absl::Status AreaAllocator::Reserve(uint64_t bytes) {
  uint64_t reserved = 0;
  if (!AlignUp(std::max<uint64_t>(bytes, 1), kAreaAlignment, &reserved)) {
    return absl::InvalidArgumentError(absl::StrCat("an area of ", bytes, " bytes"));
  }
  absl::MutexLock grow(&grow_mu_);
  return AddArea(reserved, bytes, /*take=*/false).status();
}

absl::StatusOr<std::shared_ptr<AreaSpan>> AreaAllocator::Allocate(uint64_t bytes, bool may_grow) {
  uint64_t reserved = 0;
  if (!AlignUp(std::max<uint64_t>(bytes, 1), kAreaAlignment, &reserved)) {
    return absl::InvalidArgumentError(absl::StrCat("a span of ", bytes, " bytes"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return closed_;
    if (std::shared_ptr<AreaSpan> span = TryAllocate(reserved, bytes)) return span;
    if (!may_grow) {
      return absl::ResourceExhaustedError(
          absl::StrCat("transfer areas full: ", bytes, " bytes do not fit in the free space of ",
                       areas_.size(), " areas (", Mib(allocated_bytes_), " of ", Mib(area_bytes_),
                       " held by live tensors and results)"));
    }
  }
  absl::MutexLock grow(&grow_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return closed_;
    // Another caller may have grown the areas, or spans come back, while this one waited.
    if (std::shared_ptr<AreaSpan> span = TryAllocate(reserved, bytes)) return span;
  }
  return AddArea(reserved, bytes, /*take=*/true);
}

void AreaAllocator::Release(size_t area_index, uint64_t offset) {
  absl::MutexLock lock(&mu_);
  Area& area = areas_[area_index];
  auto live = area.live.find(offset);
  if (live == area.live.end()) return;  // cannot happen: each span releases once
  uint64_t start = offset;
  uint64_t length = live->second.first;
  allocated_bytes_ -= length;
  area.live.erase(live);
  // Coalesce with the free neighbours on both sides.
  auto next = area.free.lower_bound(start);
  if (next != area.free.end() && next->first == start + length) {
    length += next->second;
    next = area.free.erase(next);
  }
  if (next != area.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      length += prev->second;
      area.free.erase(prev);
    }
  }
  area.free.emplace(start, length);
}

std::shared_ptr<AreaSpan> AreaAllocator::Find(const void* data, uint64_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  std::shared_ptr<AreaSpan> span;
  uint64_t offset = 0;
  {
    absl::MutexLock lock(&mu_);
    for (Area& area : areas_) {
      const uint8_t* base = area.mapping->data();
      if (p < base || p >= base + area.mapping->bytes()) continue;
      offset = static_cast<uint64_t>(p - base);
      auto it = area.live.upper_bound(offset);
      if (it != area.live.begin()) span = std::prev(it)->second.second.lock();
      break;
    }
  }
  // Checked (and, when refused, dropped) without the lock: this may be the span's last holder,
  // and its release takes the lock.
  if (span == nullptr) return nullptr;  // not in an area, or being released
  const uint64_t into = offset - span->offset();
  if (into > span->length() || bytes > span->length() - into) return nullptr;  // runs past it
  return span;
}

void AreaAllocator::Close(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (closed_.ok()) {
    closed_ = why.ok() ? absl::FailedPreconditionError("the client is closed") : why;
  }
}

uint32_t AreaAllocator::area_count() {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(areas_.size());
}

uint64_t AreaAllocator::area_bytes() {
  absl::MutexLock lock(&mu_);
  return area_bytes_;
}

uint64_t AreaAllocator::allocated_bytes() {
  absl::MutexLock lock(&mu_);
  return allocated_bytes_;
}

proto::HostTensor AreaTensor::Descriptor() const {
  proto::HostTensor t;
  t.name = name_;
  t.dtype = dtype_;
  t.shape = shape_;
  t.place = proto::Place::Region;
  t.slice = span_->Slice(offset_, length_);
  return t;
}

proto::HostTensor AreaTensor::ToHost() const {
  proto::HostTensor t;
  t.name = name_;
  t.dtype = dtype_;
  t.shape = shape_;
  t.data.assign(data(), data() + length_);
  return t;
}

}  // namespace pswitch::client
