#include "worker/region_map.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::worker {
namespace {

using ::testing::HasSubstr;

const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));

// A memfd of `bytes` whose byte i is `fill + i` (mod 256), sealed with `seals`.
UniqueFd MemoryFile(uint64_t bytes, int seals, uint8_t fill = 0) {
  UniqueFd fd(::memfd_create("region-map-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid());
  std::vector<uint8_t> content(bytes);
  for (uint64_t i = 0; i < bytes; ++i) content[i] = static_cast<uint8_t>(fill + i);
  EXPECT_EQ(::pwrite(fd.get(), content.data(), bytes, 0), static_cast<ssize_t>(bytes));
  if (seals != 0) {
    EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, seals), 0);
  }
  return fd;
}

UniqueFd Dup(const UniqueFd& fd) { return UniqueFd(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0)); }

RegionSpec Spec(uint64_t region, uint64_t bytes, uint64_t file_offset = 0) {
  RegionSpec spec;
  spec.region = region;
  spec.bytes = bytes;
  spec.file_offset = file_offset;
  return spec;
}

// Records what the map asks the device for, as the CUDA backend would be asked.
class RecordingDevice final : public RegionDevice {
 public:
  struct Registration final : DeviceAttachment {
    Registration(RecordingDevice* device, std::byte* base) : device(device), base(base) {}
    ~Registration() override { device->unregistered.push_back(base); }
    std::byte* device_data() const override { return nullptr; }
    RecordingDevice* device;
    std::byte* base;
  };
  absl::StatusOr<std::unique_ptr<DeviceAttachment>> RegisterHostMemory(std::byte* base,
                                                                       uint64_t bytes,
                                                                       bool) override {
    registered.emplace_back(base, bytes);
    return std::unique_ptr<DeviceAttachment>(std::make_unique<Registration>(this, base));
  }
  absl::StatusOr<std::unique_ptr<DeviceAttachment>> OpenCudaIpc(absl::string_view, int,
                                                                uint64_t) override {
    return absl::UnimplementedError("not in this test");
  }
  std::vector<std::pair<std::byte*, uint64_t>> registered;
  std::vector<std::byte*> unregistered;
};

// Refuses every page-locking, as cudaHostRegister may.
class RefusingDevice final : public RegionDevice {
 public:
  absl::StatusOr<std::unique_ptr<DeviceAttachment>> RegisterHostMemory(std::byte*, uint64_t,
                                                                       bool) override {
    return absl::InternalError("cudaHostRegister: out of memory");
  }
  absl::StatusOr<std::unique_ptr<DeviceAttachment>> OpenCudaIpc(absl::string_view, int,
                                                                uint64_t) override {
    return absl::UnimplementedError("not in this test");
  }
};

TEST(RegionMapTest, ASealedAreaIsReadInPlaceAndNeverGuarded) {
  RegionMap map(&HostRegionDevice());
  ASSERT_TRUE(map.Map(Spec(7, 3 * kPage), MemoryFile(3 * kPage, F_SEAL_SHRINK, 5)).ok());
  EXPECT_EQ(map.size(), 1u);
  absl::StatusOr<RegionBytes> slice = map.Slice({7, 100, 50});
  ASSERT_TRUE(slice.ok()) << slice.status();
  EXPECT_EQ(slice->region, 7u);
  EXPECT_EQ(slice->bytes, 50u);
  EXPECT_FALSE(slice->may_shrink);
  EXPECT_FALSE(slice->on_device);
  EXPECT_FALSE(slice->registered);  // the host backend copies with the CPU
  EXPECT_TRUE(slice->writable);
  EXPECT_EQ(static_cast<uint8_t>(slice->data[0]), static_cast<uint8_t>(5 + 100));
  EXPECT_EQ(static_cast<uint8_t>(slice->data[49]), static_cast<uint8_t>(5 + 149));
}

TEST(RegionMapTest, AFileThatCanShrinkIsGuarded) {
  RegionMap map(&HostRegionDevice());
  // No seals at all, as a /dev/shm file; a memfd sealed against growing only, likewise.
  ASSERT_TRUE(map.Map(Spec(1, kPage), MemoryFile(kPage, 0)).ok());
  ASSERT_TRUE(map.Map(Spec(2, kPage), MemoryFile(kPage, F_SEAL_GROW)).ok());
  EXPECT_TRUE(map.Slice({1, 0, kPage})->may_shrink);
  EXPECT_TRUE(map.Slice({2, 0, kPage})->may_shrink);
}

TEST(RegionMapTest, MapsFromTheFileOffset) {
  RegionMap map(&HostRegionDevice());
  ASSERT_TRUE(map.Map(Spec(3, kPage, kPage), MemoryFile(2 * kPage, F_SEAL_SHRINK)).ok());
  EXPECT_EQ(static_cast<uint8_t>(map.Slice({3, 1, 1})->data[0]), static_cast<uint8_t>(kPage + 1));
  EXPECT_EQ(map.Slice({3, 0, kPage + 1}).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(RegionMapTest, ThePassedFileIsClosedAfterMapping) {
  RegionMap map(&HostRegionDevice());
  UniqueFd fd = MemoryFile(kPage, F_SEAL_SHRINK);
  const int number = fd.get();
  ASSERT_TRUE(map.Map(Spec(4, kPage), std::move(fd)).ok());
  EXPECT_EQ(::fcntl(number, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);
  // Refused maps close it too.
  UniqueFd refused = MemoryFile(kPage, F_SEAL_SHRINK);
  const int refused_number = refused.get();
  EXPECT_FALSE(map.Map(Spec(5, 2 * kPage), std::move(refused)).ok());
  EXPECT_EQ(::fcntl(refused_number, F_GETFD), -1);
}

TEST(RegionMapTest, ARemapReplacesAndAnUnmapRemoves) {
  RecordingDevice device;
  RegionMap map(&device);
  ASSERT_TRUE(map.Map(Spec(9, kPage), MemoryFile(kPage, F_SEAL_SHRINK, 'a')).ok());
  ASSERT_TRUE(map.Map(Spec(9, kPage), MemoryFile(kPage, F_SEAL_SHRINK, 'b')).ok());
  EXPECT_EQ(map.size(), 1u);
  EXPECT_EQ(static_cast<char>(map.Slice({9, 0, 1})->data[0]), 'b');
  ASSERT_EQ(device.registered.size(), 2u);
  ASSERT_EQ(device.unregistered.size(), 1u);  // the replaced mapping's registration went
  EXPECT_EQ(device.unregistered[0], device.registered[0].first);
  ASSERT_TRUE(map.Unmap(9).ok());
  EXPECT_EQ(device.unregistered.size(), 2u);
  EXPECT_EQ(map.size(), 0u);
  absl::Status gone = map.Slice({9, 0, 1}).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.message(), HasSubstr("region 9 is not mapped"));
  EXPECT_EQ(map.Unmap(9).code(), absl::StatusCode::kNotFound);
}

TEST(RegionMapTest, OnlyMappingsThatCannotShrinkAreRegisteredWithTheDevice) {
  RecordingDevice device;
  RegionMap map(&device);
  ASSERT_TRUE(map.Map(Spec(1, 2 * kPage), MemoryFile(2 * kPage, F_SEAL_SHRINK)).ok());
  ASSERT_TRUE(map.Map(Spec(2, kPage), MemoryFile(kPage, 0)).ok());
  ASSERT_EQ(device.registered.size(), 1u);
  EXPECT_EQ(device.registered[0].first, map.Slice({1, 0, 0})->data);
  EXPECT_EQ(device.registered[0].second, 2 * kPage);
  EXPECT_TRUE(map.Slice({1, 0, 1})->registered);
  EXPECT_FALSE(map.Slice({2, 0, 1})->registered);
}

// The MapRegion has no answer of its own: the Run that names the region says why it is missing.
TEST(RegionMapTest, ARunNamesWhyItsRegionCouldNotBeMapped) {
  RefusingDevice device;
  RegionMap map(&device);
  const absl::Status refused = map.Map(Spec(3, kPage), MemoryFile(kPage, F_SEAL_SHRINK));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInternal);
  absl::Status slice = map.Slice({3, 0, 1}).status();
  EXPECT_EQ(slice.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(slice.message(), HasSubstr("could not be mapped"));
  EXPECT_THAT(slice.message(), HasSubstr("cudaHostRegister: out of memory"));
  // A region never asked for, or one whose failure was unmapped since, is only "not mapped".
  EXPECT_THAT(map.Slice({4, 0, 1}).status().message(), HasSubstr("is not mapped"));
  EXPECT_EQ(map.Unmap(3).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(map.Slice({3, 0, 1}).status().message(), HasSubstr("is not mapped"));
  // A file that can shrink is never page-locked: it maps, and the failure is forgotten.
  ASSERT_TRUE(map.Map(Spec(3, kPage), MemoryFile(kPage, F_SEAL_SHRINK)).code() !=
              absl::StatusCode::kOk);
  ASSERT_TRUE(map.Map(Spec(3, kPage), MemoryFile(kPage, 0)).ok());
  EXPECT_TRUE(map.Slice({3, 0, 1}).ok());
}

TEST(RegionMapTest, SlicesOutsideTheMappingAreRefused) {
  RegionMap map(&HostRegionDevice());
  ASSERT_TRUE(map.Map(Spec(6, kPage), MemoryFile(kPage, F_SEAL_SHRINK)).ok());
  EXPECT_TRUE(map.Slice({6, 0, kPage}).ok());
  EXPECT_TRUE(map.Slice({6, kPage, 0}).ok());
  absl::Status past = map.Slice({6, kPage - 8, 16}).status();
  EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(past.message(), HasSubstr("region 6"));
  EXPECT_EQ(map.Slice({6, kPage + 1, 0}).status().code(), absl::StatusCode::kOutOfRange);
  // offset + length wraps around 64 bits to a small number: still refused.
  EXPECT_EQ(map.Slice({6, 16, UINT64_MAX - 8}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(map.Slice({6, UINT64_MAX, 2}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(map.Slice({8, 0, 1}).status().code(), absl::StatusCode::kNotFound);
}

TEST(RegionMapTest, BadSpecsAreRefusedNamingTheRegion) {
  RegionMap map(&HostRegionDevice());
  EXPECT_EQ(map.Map(Spec(0, kPage), MemoryFile(kPage, F_SEAL_SHRINK)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(map.Map(Spec(1, 0), MemoryFile(kPage, F_SEAL_SHRINK)).code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status no_file = map.Map(Spec(1, kPage), UniqueFd());
  EXPECT_EQ(no_file.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_file.message(), HasSubstr("region 1"));
  EXPECT_EQ(map.Map(Spec(1, kPage, 100), MemoryFile(2 * kPage, F_SEAL_SHRINK)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(map.Map(Spec(1, UINT64_MAX - kPage + 1, kPage), MemoryFile(kPage, 0)).code(),
            absl::StatusCode::kInvalidArgument);
  // A sealed file smaller than the region: touching its end unguarded would fault.
  absl::Status small = map.Map(Spec(1, 2 * kPage), MemoryFile(kPage, F_SEAL_SHRINK));
  EXPECT_EQ(small.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(small.message(), HasSubstr("past the end of its file"));
  EXPECT_EQ(map.size(), 0u);
}

TEST(RegionMapTest, TheNumberOfRegionsIsBounded) {
  RegionMap map(&HostRegionDevice(), 2);
  UniqueFd file = MemoryFile(kPage, F_SEAL_SHRINK);
  ASSERT_TRUE(map.Map(Spec(1, kPage), Dup(file)).ok());
  ASSERT_TRUE(map.Map(Spec(2, kPage), Dup(file)).ok());
  absl::Status third = map.Map(Spec(3, kPage), Dup(file));
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.message(), HasSubstr("at most 2"));
  EXPECT_TRUE(map.Map(Spec(2, kPage), Dup(file)).ok());  // a re-map takes no new slot
  ASSERT_TRUE(map.Unmap(1).ok());
  EXPECT_TRUE(map.Map(Spec(3, kPage), Dup(file)).ok());
  EXPECT_EQ(map.size(), 2u);
}

TEST(RegionMapTest, AReadOnlyFileMapsForInputsOnly) {
  RegionMap map(&HostRegionDevice());
  UniqueFd file = MemoryFile(kPage, F_SEAL_SHRINK, 1);
  UniqueFd read_only(
      ::open(("/proc/self/fd/" + std::to_string(file.get())).c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(read_only.valid());
  ASSERT_TRUE(map.Map(Spec(1, kPage), std::move(read_only)).ok());
  EXPECT_FALSE(map.Slice({1, 0, 1})->writable);
  EXPECT_EQ(static_cast<uint8_t>(map.Slice({1, 3, 1})->data[0]), 4);
}

TEST(RegionMapTest, CudaSharedMemoryIsRefusedOnTheHostBackend) {
  RegionMap map(&HostRegionDevice());
  RegionSpec spec = Spec(1, kPage);
  spec.cuda_ipc_handle = std::string(64, 'h');
  absl::Status refused = map.Map(spec, UniqueFd());
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("CUDA backend"));
  EXPECT_EQ(map.size(), 0u);
}

}  // namespace
}  // namespace pswitch::worker
