#include "client/transfer_area.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::client {
namespace {

using ::testing::HasSubstr;

TEST(TransferAreaTest, IsASealedSharedMemfd) {
  auto area = TransferArea::Create(1 << 20, "test-area");
  ASSERT_TRUE(area.ok()) << area.status();
  EXPECT_EQ((*area)->bytes(), 1u << 20);
  const int fd = (*area)->fd();
  // pswitchd refuses an area that could shrink under its workers' mappings.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  ASSERT_GE(seals, 0) << "not a memfd created with MFD_ALLOW_SEALING";
  EXPECT_NE(seals & F_SEAL_SHRINK, 0);
  EXPECT_NE(::ftruncate(fd, 4096), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  char link[64] = {};
  ASSERT_GT(::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), link, sizeof(link) - 1), 0);
  EXPECT_THAT(std::string(link), HasSubstr("memfd:test-area"));
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(st.st_size, 1 << 20);
  // The mapping is the file: what the client writes, a peer holding the fd reads.
  std::memcpy((*area)->data() + 4096, "pswitch", 7);
  char read_back[8] = {};
  ASSERT_EQ(::pread(fd, read_back, 7, 4096), 7);
  EXPECT_STREQ(read_back, "pswitch");
}

TEST(TransferAreaTest, RefusesZeroBytes) {
  EXPECT_EQ(TransferArea::Create(0, "x").status().code(), absl::StatusCode::kInvalidArgument);
}

// A registrar that stands in for pswitchd: ids from 1, every area kept.
struct FakeRegistrar {
  std::atomic<uint64_t> next_id{1};
  std::atomic<int> calls{0};
  std::vector<uint64_t> sizes;
  absl::Mutex mu;
  AreaRegistrar Get() {
    return [this](const TransferArea& area) -> absl::StatusOr<uint64_t> {
      ++calls;
      absl::MutexLock lock(&mu);
      sizes.push_back(area.bytes());
      return next_id++;
    };
  }
};

AreaAllocatorOptions Small() {
  AreaAllocatorOptions o;
  o.first_area_bytes = 64 << 10;
  o.max_areas = 4;
  o.max_total_bytes = 1 << 20;
  return o;
}

TEST(AreaAllocatorTest, SpansAreAlignedAndDisjoint) {
  FakeRegistrar registrar;
  auto areas = AreaAllocator::Create(Small(), registrar.Get());
  std::vector<std::shared_ptr<AreaSpan>> spans;
  for (uint64_t bytes : {1, 63, 64, 65, 100, 1000, 0, 4096, 7}) {
    auto span = areas->Allocate(bytes);
    ASSERT_TRUE(span.ok()) << span.status();
    EXPECT_EQ((*span)->offset() % kAreaAlignment, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*span)->data()) % kAreaAlignment, 0u);
    EXPECT_EQ((*span)->length(), bytes);
    EXPECT_EQ((*span)->area_id(), 1u);
    spans.push_back(*span);
  }
  // No two spans share a byte (each reserves its length rounded up to the alignment).
  std::set<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& s : spans)
    ranges.emplace(s->offset(), s->offset() + std::max<uint64_t>(s->length(), 1));
  uint64_t end = 0;
  for (const auto& [begin, stop] : ranges) {
    EXPECT_GE(begin, end);
    end = stop;
  }
  EXPECT_EQ(registrar.calls, 1);
  EXPECT_EQ(areas->allocated_bytes(), 0u + 64 + 64 + 64 + 128 + 128 + 1024 + 64 + 4096 + 64);
}

TEST(AreaAllocatorTest, ReleasedSpansCoalesceAndAreReused) {
  FakeRegistrar registrar;
  auto areas = AreaAllocator::Create(Small(), registrar.Get());
  ASSERT_TRUE(areas->Reserve(0).ok());
  ASSERT_EQ(areas->area_bytes(), 64u << 10);
  {
    std::vector<std::shared_ptr<AreaSpan>> spans;
    for (int i = 0; i < 16; ++i) {
      auto span = areas->Allocate(4096);
      ASSERT_TRUE(span.ok()) << span.status();
      spans.push_back(*span);
    }
    EXPECT_EQ(areas->allocated_bytes(), 64u << 10);
    // Freed out of order: the neighbours on both sides must merge back into one range.
    for (int i : {3, 1, 2, 0, 15, 8, 9, 7, 4, 6, 5, 10, 12, 11, 14, 13}) spans[i].reset();
  }
  EXPECT_EQ(areas->allocated_bytes(), 0u);
  // The whole area is one free range again: a span of all of it fits without another area.
  auto whole = areas->Allocate(64 << 10);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ((*whole)->offset(), 0u);
  EXPECT_EQ(areas->area_count(), 1u);
  EXPECT_EQ(registrar.calls, 1);
}

TEST(AreaAllocatorTest, GrowsWithAnAreaSizedToFitThenStopsAtTheBound) {
  FakeRegistrar registrar;
  auto areas = AreaAllocator::Create(Small(), registrar.Get());
  auto a = areas->Allocate(60 << 10);
  ASSERT_TRUE(a.ok());
  // Bigger than the first area's size: the next area is sized to fit it.
  auto b = areas->Allocate(300 << 10);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->area_id(), 2u);
  EXPECT_GE(registrar.sizes.at(1), 300u << 10);
  auto c = areas->Allocate(600 << 10);  // 64 + 300 + 600 KiB: within 1 MiB
  ASSERT_TRUE(c.ok()) << c.status();
  // Past the byte bound: refused, naming the bound and what to do.
  auto d = areas->Allocate(200 << 10);
  ASSERT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(d.status().message(), HasSubstr("1 MiB"));
  EXPECT_THAT(d.status().message(), HasSubstr("release results"));
  EXPECT_EQ(areas->area_count(), 3u);
  // Releasing makes room again without another area.
  c->reset();
  EXPECT_TRUE(areas->Allocate(200 << 10).ok());
  EXPECT_EQ(areas->area_count(), 3u);
}

TEST(AreaAllocatorTest, StopsAtTheAreaCount) {
  FakeRegistrar registrar;
  AreaAllocatorOptions o = Small();
  o.max_areas = 2;
  auto areas = AreaAllocator::Create(o, registrar.Get());
  auto a = areas->Allocate(64 << 10);
  auto b = areas->Allocate(64 << 10);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = areas->Allocate(64);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("2 areas"));
  // Without growth (the reader thread's case) a full allocator says so at once.
  EXPECT_EQ(areas->Allocate(64, /*may_grow=*/false).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(registrar.calls, 2);
}

TEST(AreaAllocatorTest, RegistrationErrorsComeBackAndNothingIsKept) {
  int calls = 0;
  auto areas = AreaAllocator::Create(Small(), [&](const TransferArea&) -> absl::StatusOr<uint64_t> {
    ++calls;
    return absl::ResourceExhaustedError("pswitchd: too many regions");
  });
  auto span = areas->Allocate(10);
  EXPECT_EQ(span.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(span.status().message(), HasSubstr("too many regions"));
  EXPECT_EQ(areas->area_count(), 0u);
  EXPECT_EQ(calls, 1);
}

TEST(AreaAllocatorTest, RegistrarRunsWithoutTheLock) {
  // Releases arrive on the connection's reader thread while a registration waits for its reply:
  // a registrar that touches the allocator must not deadlock.
  std::shared_ptr<AreaAllocator> areas;
  std::shared_ptr<AreaSpan> held;
  uint64_t next = 1;
  areas = AreaAllocator::Create(Small(), [&](const TransferArea&) -> absl::StatusOr<uint64_t> {
    held.reset();  // a release during registration
    (void)areas->allocated_bytes();
    return next++;
  });
  held = *areas->Allocate(64 << 10);
  auto second = areas->Allocate(64 << 10);  // registers area 2, releasing `held` meanwhile
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(areas->allocated_bytes(), 64u << 10);
}

TEST(AreaAllocatorTest, FindsTheLiveSpanBehindAnAddress) {
  FakeRegistrar registrar;
  auto areas = AreaAllocator::Create(Small(), registrar.Get());
  auto a = *areas->Allocate(1000);
  auto b = *areas->Allocate(1000);
  EXPECT_EQ(areas->Find(a->data(), 1000), a);
  EXPECT_EQ(areas->Find(a->data() + 10, 990), a);
  EXPECT_EQ(areas->Find(b->data() + 999, 1), b);
  EXPECT_EQ(areas->Find(a->data() + 10, 991), nullptr);  // runs past a's bytes
  int outside = 0;
  EXPECT_EQ(areas->Find(&outside, sizeof(outside)), nullptr);
  uint8_t* freed = a->data();
  a.reset();
  EXPECT_EQ(areas->Find(freed, 10), nullptr);
}

TEST(AreaAllocatorTest, CloseRefusesLaterSpansAndKeepsThoseOut) {
  FakeRegistrar registrar;
  auto areas = AreaAllocator::Create(Small(), registrar.Get());
  auto a = *areas->Allocate(128);
  areas->Close(absl::UnavailableError("connection to pswitchd lost"));
  auto b = areas->Allocate(128);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
  std::memset(a->data(), 7, 128);  // still mapped
  EXPECT_EQ(a->data()[127], 7);
}

TEST(AreaAllocatorTest, SpansOutliveTheAllocatorHandle) {
  FakeRegistrar registrar;
  auto areas = AreaAllocator::Create(Small(), registrar.Get());
  auto a = *areas->Allocate(4096);
  areas.reset();  // the span holds the allocator and so the mapping
  std::memset(a->data(), 1, 4096);
  EXPECT_EQ(a->data()[4095], 1);
}

TEST(AreaAllocatorTest, ConcurrentCallersNeverShareBytes) {
  FakeRegistrar registrar;
  AreaAllocatorOptions o;
  o.first_area_bytes = 256 << 10;
  o.max_areas = 8;
  o.max_total_bytes = 8 << 20;
  auto areas = AreaAllocator::Create(o, registrar.Get());
  constexpr int kThreads = 8;
  std::atomic<int> corrupt{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<std::shared_ptr<AreaSpan>> held;
      for (int i = 0; i < 2000; ++i) {
        const uint64_t bytes = 1 + rng() % 8192;
        auto span = areas->Allocate(bytes);
        if (!span.ok()) {
          ++failed;
          continue;
        }
        std::memset((*span)->data(), t + 1, bytes);
        held.push_back(*span);
        if (held.size() > 8 || rng() % 2 == 0) {
          const size_t victim = rng() % held.size();
          const AreaSpan& s = *held[victim];
          for (uint64_t k = 0; k < s.length(); ++k) {
            if (s.data()[k] != t + 1) {
              ++corrupt;
              break;
            }
          }
          held.erase(held.begin() + static_cast<long>(victim));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(corrupt, 0);
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(areas->allocated_bytes(), 0u);
  EXPECT_LE(areas->area_count(), 8u);
}

TEST(AreaTensorTest, DescriptorNamesItsSliceAndToHostCopies) {
  FakeRegistrar registrar;
  auto areas = AreaAllocator::Create(Small(), registrar.Get());
  auto span = *areas->Allocate(256);
  AreaTensor t("input", proto::DType::F32, {2, 8}, span, 128, 64);
  float values[16];
  for (int i = 0; i < 16; ++i) values[i] = static_cast<float>(i);
  std::memcpy(t.data(), values, 64);
  proto::HostTensor d = t.Descriptor();
  EXPECT_EQ(d.place, proto::Place::Region);
  EXPECT_TRUE(d.data.empty());
  EXPECT_EQ(d.slice, (proto::ByteSlice{span->area_id(), span->offset() + 128, 64}));
  proto::HostTensor host = t.ToHost();
  EXPECT_EQ(host.place, proto::Place::Inline);
  ASSERT_EQ(host.data.size(), 64u);
  EXPECT_EQ(std::memcmp(host.data.data(), values, 64), 0);
  EXPECT_EQ(host.shape, (std::vector<int64_t>{2, 8}));
}

}  // namespace
}  // namespace pswitch::client
