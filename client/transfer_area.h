// The client's side of the local data plane (docs/dataplane.md): transfer areas (sealed memfds
// mapped here and registered with pswitchd over the Unix socket) and the allocator that hands
// their bytes out to the calls in flight.
//
// Design. An area is one memfd, sealed against shrinking so that no mapping of it can ever fault
// (pswitchd's workers map it too). The allocator keeps, per area, the free ranges (first fit,
// coalesced on release) and the spans handed out. A span is held by shared_ptr: the inputs of a
// call, a result's outputs and the Python arrays viewing them share it, and its bytes go back to
// the allocator when the last holder lets go. Every span and the allocator itself keep the
// mappings alive (the span holds the allocator), so a view never dangles, even past the Client.
// When no area has room, the allocator asks its AreaRegistrar for another area big enough, up to
// its bounds, and says which bound stops it.
#ifndef PSWITCH_CLIENT_TRANSFER_AREA_H_
#define PSWITCH_CLIENT_TRANSFER_AREA_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "base/unique_fd.h"
#include "proto/host_tensor.h"

namespace pswitch::client {

// Every span starts at a multiple of this inside its area (and pswitchd packs outputs so too).
inline constexpr uint64_t kAreaAlignment = 64;

// One memfd (MFD_ALLOW_SEALING | MFD_CLOEXEC, F_SEAL_SHRINK) mapped read-write. Immutable after
// creation; thread-safe. Unmapped and closed when destroyed.
class TransferArea {
 public:
  // A new zero-filled area of `bytes` (> 0), named `name` in /proc/*/fd listings.
  static absl::StatusOr<std::unique_ptr<TransferArea>> Create(uint64_t bytes,
                                                              absl::string_view name);
  ~TransferArea();
  TransferArea(const TransferArea&) = delete;
  TransferArea& operator=(const TransferArea&) = delete;

  int fd() const { return fd_.get(); }
  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 private:
  TransferArea(UniqueFd fd, uint8_t* data, uint64_t bytes)
      : fd_(std::move(fd)), data_(data), bytes_(bytes) {}

  const UniqueFd fd_;
  uint8_t* const data_;
  const uint64_t bytes_;
};

// Registers `area` with pswitchd and returns the id it gave (RegisterArea/AreaRegistered). The
// area stays registered until the connection ends. Called without the allocator's lock held.
using AreaRegistrar = std::function<absl::StatusOr<uint64_t>(const TransferArea& area)>;

struct AreaAllocatorOptions {
  uint64_t first_area_bytes = 64ull << 20;  // later areas: at least this, or the request
  uint32_t max_areas = 16;
  uint64_t max_total_bytes = 4ull << 30;  // all areas together
};

class AreaAllocator;

// `length` bytes at `offset` of area `area_id`, 64-byte aligned, handed to one holder (shared by
// whatever it is given to). Returned to the allocator when destroyed. Thread-safe.
class AreaSpan {
 public:
  ~AreaSpan();
  AreaSpan(const AreaSpan&) = delete;
  AreaSpan& operator=(const AreaSpan&) = delete;

  uint64_t area_id() const { return area_id_; }
  uint64_t offset() const { return offset_; }  // in the area
  uint64_t length() const { return length_; }  // as asked (its reservation is rounded up)
  uint8_t* data() const { return data_; }
  // The wire's slice for `length` bytes at `offset` inside this span.
  proto::ByteSlice Slice(uint64_t offset, uint64_t length) const {
    return proto::ByteSlice{area_id_, offset_ + offset, length};
  }

 private:
  friend class AreaAllocator;
  AreaSpan(std::shared_ptr<AreaAllocator> allocator, size_t area_index, uint64_t area_id,
           uint64_t offset, uint64_t length, uint8_t* data)
      : allocator_(std::move(allocator)),
        area_index_(area_index),
        area_id_(area_id),
        offset_(offset),
        length_(length),
        data_(data) {}

  const std::shared_ptr<AreaAllocator> allocator_;  // keeps the mapping alive
  const size_t area_index_;
  const uint64_t area_id_;
  const uint64_t offset_;
  const uint64_t length_;
  uint8_t* const data_;
};

// Thread-safe. Create it with Create (spans hold it by shared_ptr).
class AreaAllocator : public std::enable_shared_from_this<AreaAllocator> {
 public:
  static std::shared_ptr<AreaAllocator> Create(AreaAllocatorOptions options,
                                               AreaRegistrar registrar);
  AreaAllocator(const AreaAllocator&) = delete;
  AreaAllocator& operator=(const AreaAllocator&) = delete;

  // Registers an area of at least `bytes` (the first area's size when larger) now, so the first
  // call does not pay for it. Errors as Allocate.
  absl::Status Reserve(uint64_t bytes);
  // A span of `bytes` (0 reserves one aligned unit), registering another area when none has
  // room and `may_grow` (a thread that delivers the registrar's replies must pass false).
  // ResourceExhausted naming the bound when the areas are at it (or full, without may_grow);
  // FailedPrecondition once Close was called; the registrar's error when registration fails.
  absl::StatusOr<std::shared_ptr<AreaSpan>> Allocate(uint64_t bytes, bool may_grow = true);
  // The live span holding [data, data + bytes) (the pointer inside one of the areas), or null:
  // how the Python package recognises an array that already views an area.
  std::shared_ptr<AreaSpan> Find(const void* data, uint64_t bytes);
  // Later Allocate calls fail (the connection that registered the areas is gone: pswitchd no
  // longer knows them). Spans already out stay valid.
  void Close(const absl::Status& why);

  // For tests and reports.
  uint32_t area_count();
  uint64_t area_bytes();       // all areas together
  uint64_t allocated_bytes();  // reserved by live spans (each rounded up to the alignment)

 private:
  friend class AreaSpan;
  struct Area {
    uint64_t id = 0;  // pswitchd's
    std::unique_ptr<TransferArea> mapping;
    std::map<uint64_t, uint64_t> free;  // offset -> bytes, coalesced
    std::map<uint64_t, std::pair<uint64_t, std::weak_ptr<AreaSpan>>> live;  // offset -> reserved
  };
  AreaAllocator(AreaAllocatorOptions options, AreaRegistrar registrar)
      : options_(options), registrar_(std::move(registrar)) {}

  // A span from an existing area's free ranges; null when none has room.
  std::shared_ptr<AreaSpan> TryAllocate(uint64_t reserved, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<AreaSpan> TryAllocateIn(size_t area_index, uint64_t reserved, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(size_t area_index, uint64_t offset);
  // Registers one more area with room for `reserved` bytes, within the bounds, and (`take`)
  // returns a span of it carved before any other caller can take the room.
  absl::StatusOr<std::shared_ptr<AreaSpan>> AddArea(uint64_t reserved, uint64_t bytes, bool take)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(grow_mu_);

  const AreaAllocatorOptions options_;
  const AreaRegistrar registrar_;
  // Serialises growth (registration is a round trip, done without mu_ so releases, which come
  // from the connection's reader thread, never wait on it). Order: grow_mu_ before mu_.
  absl::Mutex grow_mu_;
  absl::Mutex mu_;
  // Areas are only appended: an index names one for the allocator's life.
  std::vector<Area> areas_ ABSL_GUARDED_BY(mu_);
  uint64_t area_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t allocated_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
};

// A tensor whose bytes lie in a transfer area: dtype and shape over `length` bytes at `offset`
// of a span. Copies share the span (a cheap handle); the bytes stay valid while any copy lives.
// Writing into an input while a call that uses it is in flight races with the worker's read.
class AreaTensor {
 public:
  AreaTensor() = default;
  AreaTensor(std::string name, proto::DType dtype, std::vector<int64_t> shape,
             std::shared_ptr<AreaSpan> span, uint64_t offset, uint64_t length)
      : name_(std::move(name)),
        dtype_(dtype),
        shape_(std::move(shape)),
        span_(std::move(span)),
        offset_(offset),
        length_(length) {}

  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  proto::DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  bool valid() const { return span_ != nullptr; }
  uint8_t* data() const { return span_->data() + offset_; }
  uint64_t length() const { return length_; }
  std::span<uint8_t> bytes() const { return {data(), static_cast<size_t>(length_)}; }
  const std::shared_ptr<AreaSpan>& span() const { return span_; }

  // What the wire carries for it: a Place::Region tensor naming its slice (no bytes).
  proto::HostTensor Descriptor() const;
  // A copy of its bytes in an ordinary HostTensor (Place::Inline), independent of the area.
  proto::HostTensor ToHost() const;

 private:
  std::string name_;
  proto::DType dtype_ = proto::DType::F32;
  std::vector<int64_t> shape_;
  std::shared_ptr<AreaSpan> span_;
  uint64_t offset_ = 0;  // in the span
  uint64_t length_ = 0;
};

}  // namespace pswitch::client

#endif  // PSWITCH_CLIENT_TRANSFER_AREA_H_
