#include "worker/lease_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace pswitch::worker {
namespace {

constexpr size_t kLeaseBytes = 1 << 20;

// One allocator per process (it becomes libtorch's CPU allocator); the tests share it and each
// leaves it empty.
struct Shared {
  std::vector<std::byte> lease = std::vector<std::byte>(kLeaseBytes);
  LeaseAllocator* allocator =
      LeaseAllocator::Install(lease.data(), lease.size(), c10::GetDefaultCPUAllocator());
  bool Inside(const void* p) const {
    auto* b = static_cast<const std::byte*>(p);
    return b >= lease.data() && b < lease.data() + lease.size();
  }
};

Shared& Get() {
  static Shared* shared = new Shared();
  return *shared;
}

TEST(LeaseAllocatorTest, ServesFromTheLeaseOnlyWhileActiveAndReusesFreedBlocks) {
  Shared& s = Get();
  LeaseAllocator& allocator = *s.allocator;
  EXPECT_EQ(c10::GetCPUAllocator(), &allocator);
  c10::DataPtr outside = allocator.allocate(1000);
  EXPECT_FALSE(s.Inside(outside.get()));
  {
    ScopedLeaseAllocation active(&allocator);
    c10::DataPtr a = allocator.allocate(1000);
    c10::DataPtr b = allocator.allocate(3000);
    EXPECT_TRUE(s.Inside(a.get()) && s.Inside(b.get()));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.get()) % 64, 0u);
    EXPECT_EQ(allocator.in_use_bytes(), 1024u + 3008u);
    void* first = a.get();
    a.clear();  // freed: the next fitting block reuses it
    c10::DataPtr c = allocator.allocate(512);
    EXPECT_EQ(c.get(), first);
    // The raw interface (used by oneDNN) frees by pointer.
    void* raw = allocator.raw_allocate(256);
    EXPECT_TRUE(s.Inside(raw));
    allocator.raw_deallocate(raw);
  }
  EXPECT_EQ(allocator.in_use_bytes(), 0u);
  EXPECT_GE(allocator.peak_bytes(), 1024u + 3008u);
  // Raw allocations outside a task come from (and return to) the fallback.
  void* raw = allocator.raw_allocate(256);
  EXPECT_FALSE(s.Inside(raw));
  allocator.raw_deallocate(raw);
}

TEST(LeaseAllocatorTest, AnOversizedRequestFailsWithoutTouchingOtherBlocks) {
  Shared& s = Get();
  LeaseAllocator& allocator = *s.allocator;
  ScopedLeaseAllocation active(&allocator);
  c10::DataPtr kept = allocator.allocate(kLeaseBytes / 2);
  try {
    c10::DataPtr too_big = allocator.allocate(kLeaseBytes * 3 / 4);
    ADD_FAILURE() << "allocation beyond the lease succeeded";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("activation lease exhausted"), std::string::npos);
  }
  EXPECT_EQ(allocator.in_use_bytes(), kLeaseBytes / 2);
  kept.clear();
  // Freed neighbours coalesce: three quarters of the lease fit in one block again.
  c10::DataPtr big = allocator.allocate(kLeaseBytes * 3 / 4);
  EXPECT_TRUE(s.Inside(big.get()));
}

// An archive returning torch.empty read the previous task's activations: after an owner change
// every block comes back zeroed, while the same owner's next task pays nothing.
TEST(LeaseAllocatorTest, BlocksAnotherOwnerTouchedComeBackZeroed) {
  Shared& s = Get();
  LeaseAllocator& allocator = *s.allocator;
  ScopedLeaseAllocation active(&allocator);
  constexpr size_t kBytes = 64 << 10;
  {
    c10::DataPtr secret = allocator.allocate(kBytes);
    std::memset(secret.get(), 0x5a, kBytes);
  }
  {
    // The same owner: not cleared (and nothing dirty).
    c10::DataPtr again = allocator.allocate(kBytes);
    EXPECT_EQ(static_cast<unsigned char*>(again.get())[kBytes / 2], 0x5a);
  }
  allocator.NewOwner();
  EXPECT_GE(allocator.dirty_bytes(), kBytes);
  c10::DataPtr other = allocator.allocate(kBytes);
  const auto* bytes = static_cast<const unsigned char*>(other.get());
  size_t nonzero = 0;
  for (size_t i = 0; i < kBytes; ++i) nonzero += bytes[i] != 0;
  EXPECT_EQ(nonzero, 0u);
}

}  // namespace
}  // namespace pswitch::worker
