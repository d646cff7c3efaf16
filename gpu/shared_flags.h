// Flag words in host memory that several processes map (MAP_SHARED). The host backend keeps
// them inside its memfd arena; the CUDA backend keeps them in a memfd beside the device arena,
// registered with the driver so device streams wait on and write them (see cuda_memory.h). In
// both, the CPU reads and writes a flag with a plain atomic access: releasing a waiter never
// goes through a stream, so it cannot queue behind the very wait it must release.
#ifndef PSWITCH_GPU_SHARED_FLAGS_H_
#define PSWITCH_GPU_SHARED_FLAGS_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "gpu/flags.h"

namespace pswitch::gpu {

// Thread-safe; usable from any process that maps the words.
class SharedFlagArray : public FlagArray {
 public:
  // `device_writes`: a device may write the words too. Device writes wake no futex, so a CPU
  // waiter then sleeps at most `kDevicePollInterval` between looks.
  SharedFlagArray(uint32_t* words, uint32_t count, uint64_t offset, bool device_writes)
      : words_(words), count_(count), offset_(offset), device_writes_(device_writes) {}

  static constexpr absl::Duration kDevicePollInterval = absl::Microseconds(50);

  uint32_t size() const override { return count_; }
  uint64_t arena_offset() const override { return offset_; }
  absl::StatusOr<uint32_t> Load(uint32_t index) const override;
  absl::Status Store(uint32_t index, uint32_t value) override;
  absl::Status Advance(uint32_t index, uint32_t value) override;
  absl::StatusOr<uint32_t> WaitAtLeast(uint32_t index, uint32_t target,
                                       absl::Duration timeout) const override;

 protected:
  absl::Status Check(uint32_t index) const;
  uint32_t* word(uint32_t index) const { return words_ + index; }

 private:
  std::atomic_ref<uint32_t> Word(uint32_t index) const {
    return std::atomic_ref<uint32_t>(words_[index]);
  }

  uint32_t* const words_;
  const uint32_t count_;
  const uint64_t offset_;
  const bool device_writes_;
};

}  // namespace pswitch::gpu

#endif  // PSWITCH_GPU_SHARED_FLAGS_H_
