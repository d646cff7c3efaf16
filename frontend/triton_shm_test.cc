#include "frontend/triton_shm.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "base/files.h"
#include "gtest/gtest.h"

namespace pswitch::frontend {
namespace {

using dataplane::RegionKind;
using dataplane::RegionLimits;
using dataplane::RegionTable;

// A directory standing for /dev/shm, removed at the end.
class ShmDir {
 public:
  ShmDir() {
    char path[] = "/tmp/pswitch-shm-test-XXXXXX";
    path_ = ::mkdtemp(path);
    fd_ = UniqueFd(::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  }
  ~ShmDir() { (void)base::RemoveTree(path_); }
  const std::string& path() const { return path_; }
  int fd() const { return fd_.get(); }
  std::string File(const std::string& name, off_t bytes) const {
    const std::string p = path_ + "/" + name;
    UniqueFd f(::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    EXPECT_TRUE(f.valid());
    EXPECT_EQ(::ftruncate(f.get(), bytes), 0);
    return p;
  }

 private:
  std::string path_;
  UniqueFd fd_;
};

TEST(OpenShmSegmentTest, OpensOurOwnRegularFile) {
  ShmDir dir;
  dir.File("mine", 4096);
  absl::StatusOr<UniqueFd> fd = OpenShmSegment(dir.fd(), "/mine", ::getuid());
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_TRUE(fd->valid());
  // The leading slash is shm_open's convention; a bare name is the same segment.
  EXPECT_TRUE(OpenShmSegment(dir.fd(), "mine", ::getuid()).ok());
}

// Another user's segment, a missing one, a link and a non-file get one answer: nothing tells a
// caller which names exist.
TEST(OpenShmSegmentTest, AnotherUsersMissingLinkAndNonFileLookTheSame) {
  ShmDir dir;
  dir.File("theirs", 4096);
  const absl::Status missing = OpenShmSegment(dir.fd(), "/nothing", ::getuid()).status();
  ASSERT_TRUE(absl::IsNotFound(missing)) << missing;
  auto message_for = [&](const std::string& key, uid_t uid) {
    absl::Status s = OpenShmSegment(dir.fd(), key, uid).status();
    EXPECT_EQ(s.code(), missing.code()) << key;
    // The message names the key the caller gave; otherwise it is the same.
    std::string m(s.message());
    const std::string k = key;
    return m.replace(m.find(k), k.size(), "/nothing");
  };
  // The fstat owner differs from the caller's uid: as pswitchd (root) sees another user's file.
  EXPECT_EQ(message_for("/theirs", ::getuid() + 1), missing.message());
  // A link to our own file is not followed.
  ASSERT_EQ(::symlink((dir.path() + "/theirs").c_str(), (dir.path() + "/link").c_str()), 0);
  EXPECT_EQ(message_for("/link", ::getuid()), missing.message());
  ASSERT_EQ(::mkdir((dir.path() + "/adir").c_str(), 0700), 0);
  EXPECT_EQ(message_for("/adir", ::getuid()), missing.message());
  // A FIFO would block an open without O_NONBLOCK; it is no segment either.
  ASSERT_EQ(::mkfifo((dir.path() + "/fifo").c_str(), 0600), 0);
  EXPECT_EQ(message_for("/fifo", ::getuid()), missing.message());
}

TEST(OpenShmSegmentTest, KeysThatLeaveTheDirectoryAreRefused) {
  ShmDir dir;
  const std::vector<std::string> keys = {"",
                                         "/",
                                         "/..",
                                         "/.",
                                         "..",
                                         "/a/b",
                                         "/../etc/shadow",
                                         std::string("/a\0b", 4),
                                         "/" + std::string(300, 'x')};
  for (const std::string& key : keys) {
    EXPECT_TRUE(absl::IsInvalidArgument(OpenShmSegment(dir.fd(), key, ::getuid()).status())) << key;
  }
}

TEST(TritonRegionsTest, RegisterStatusUnregister) {
  ShmDir dir;
  dir.File("seg", 8192);
  RegionTable table;
  TritonRegions regions(&table, dir.path());
  ASSERT_TRUE(regions.RegisterSystem("alice", ::getuid(), "in", "/seg", 4096, 4096).ok());
  // The same name twice is a conflict.
  EXPECT_TRUE(
      absl::IsAlreadyExists(regions.RegisterSystem("alice", ::getuid(), "in", "/seg", 0, 16)));
  auto status = regions.SystemStatus("alice", "");
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->size(), 1u);
  EXPECT_EQ((*status)[0].name, "in");
  EXPECT_EQ((*status)[0].key, "/seg");
  EXPECT_EQ((*status)[0].offset, 4096u);
  EXPECT_EQ((*status)[0].bytes, 4096u);
  // Another principal sees none of it.
  EXPECT_TRUE(regions.SystemStatus("bob", "")->empty());
  EXPECT_TRUE(absl::IsNotFound(regions.SystemStatus("bob", "in").status()));
  ASSERT_TRUE(regions.Unregister("bob", RegionKind::kShmFile, "in").ok());  // a no-op for bob
  EXPECT_EQ(table.size(), 1u);
  ASSERT_TRUE(regions.Unregister("alice", RegionKind::kShmFile, "in").ok());
  EXPECT_EQ(table.size(), 0u);
  EXPECT_TRUE(absl::IsNotFound(regions.SystemStatus("alice", "in").status()));
}

TEST(TritonRegionsTest, RangeMustLieInTheFileAndUidMustBeKnown) {
  ShmDir dir;
  dir.File("seg", 4096);
  RegionTable table;
  TritonRegions regions(&table, dir.path());
  EXPECT_FALSE(regions.RegisterSystem("alice", ::getuid(), "r", "/seg", 0, 8192).ok());
  EXPECT_FALSE(regions.RegisterSystem("alice", ::getuid(), "r", "/seg", 4096, 1).ok());
  EXPECT_FALSE(regions.RegisterSystem("alice", ::getuid(), "r", "/seg", 0, 0).ok());
  EXPECT_TRUE(
      absl::IsPermissionDenied(regions.RegisterSystem("alice", std::nullopt, "r", "/seg", 0, 16)));
  EXPECT_TRUE(
      absl::IsNotFound(regions.RegisterSystem("alice", ::getuid() + 1, "r", "/seg", 0, 16)));
  EXPECT_EQ(table.size(), 0u);
}

// 10,000 registrations: the table's bound holds, and every refusal leaves nothing behind.
TEST(TritonRegionsTest, TenThousandRegistrationsAreBounded) {
  ShmDir dir;
  dir.File("seg", 4096);
  RegionTable table(RegionLimits{64, uint64_t{1} << 30});
  TritonRegions regions(&table, dir.path());
  int accepted = 0;
  for (int i = 0; i < 10000; ++i) {
    absl::Status s =
        regions.RegisterSystem("alice", ::getuid(), "r" + std::to_string(i), "/seg", 0, 4096);
    if (s.ok()) {
      ++accepted;
    } else {
      ASSERT_TRUE(absl::IsResourceExhausted(s)) << s;
    }
  }
  EXPECT_EQ(accepted, 64);
  EXPECT_EQ(table.size(), 64u);
  EXPECT_EQ(regions.SystemStatus("alice", "")->size(), 64u);
  ASSERT_TRUE(regions.Unregister("alice", RegionKind::kShmFile, "").ok());
  EXPECT_EQ(table.size(), 0u);
}

TEST(TritonRegionsTest, CudaRegionsNeedAHandleOfSixtyFourBytes) {
  RegionTable table;
  TritonRegions regions(&table, "/nonexistent");
  EXPECT_FALSE(regions.RegisterCuda("alice", "g", std::string(10, 'x'), 0, 1024).ok());
  ASSERT_TRUE(regions.RegisterCuda("alice", "g", std::string(64, 'x'), 1, 1024).ok());
  auto status = regions.CudaStatus("alice", "g");
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->size(), 1u);
  EXPECT_EQ((*status)[0].device, 1);
  EXPECT_EQ((*status)[0].bytes, 1024u);
  // A CUDA region is not a system one.
  EXPECT_TRUE(absl::IsNotFound(regions.SystemStatus("alice", "g").status()));
}

InferRequest ShmRequest(const std::string& in_region, uint64_t in_offset, uint64_t in_bytes) {
  InferRequest r;
  proto::HostTensor t;
  t.name = "input";
  t.dtype = proto::DType::F32;
  t.shape = {static_cast<int64_t>(in_bytes / 4)};
  t.place = proto::Place::Region;
  t.slice = proto::ByteSlice{0, in_offset, in_bytes};
  r.inputs.push_back(t);
  r.input_regions.push_back(ShmReference{in_region, in_offset, in_bytes});
  return r;
}

TEST(PlaceInRegionsTest, ResolvesNamesToTheCallersRegions) {
  ShmDir dir;
  dir.File("seg", 8192);
  RegionTable table;
  TritonRegions regions(&table, dir.path());
  ASSERT_TRUE(regions.RegisterSystem("alice", ::getuid(), "in", "/seg", 0, 4096).ok());
  ASSERT_TRUE(regions.RegisterSystem("alice", ::getuid(), "out", "/seg", 4096, 4096).ok());
  const uint64_t in_id = (*table.FindByName("alice", "in"))->id();
  const uint64_t out_id = (*table.FindByName("alice", "out"))->id();

  InferRequest r = ShmRequest("in", 64, 128);
  r.output_regions.emplace_back("output", ShmReference{"out", 0, 4096});
  std::vector<std::shared_ptr<const dataplane::TransferRegion>> held;
  std::optional<proto::ByteSlice> outputs_to;
  ASSERT_TRUE(PlaceInRegions(table, "alice", r, &held, &outputs_to).ok());
  EXPECT_EQ(r.inputs[0].slice, (proto::ByteSlice{in_id, 64, 128}));
  ASSERT_TRUE(outputs_to.has_value());
  EXPECT_EQ(*outputs_to, (proto::ByteSlice{out_id, 0, 4096}));
  EXPECT_EQ(held.size(), 2u);

  // Bob names alice's region: as if it did not exist.
  InferRequest bobs = ShmRequest("in", 0, 128);
  held.clear();
  absl::Status s = PlaceInRegions(table, "bob", bobs, &held, &outputs_to);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_TRUE(held.empty());
}

TEST(PlaceInRegionsTest, SlicesOutsideTheRegionOrItsShrunkFileAreRefused) {
  ShmDir dir;
  const std::string file = dir.File("seg", 8192);
  RegionTable table;
  TritonRegions regions(&table, dir.path());
  ASSERT_TRUE(regions.RegisterSystem("alice", ::getuid(), "in", "/seg", 0, 8192).ok());
  std::vector<std::shared_ptr<const dataplane::TransferRegion>> held;
  std::optional<proto::ByteSlice> outputs_to;
  InferRequest past_end = ShmRequest("in", 8192 - 64, 128);
  EXPECT_TRUE(absl::IsOutOfRange(PlaceInRegions(table, "alice", past_end, &held, &outputs_to)));
  InferRequest overflow = ShmRequest("in", UINT64_MAX - 8, 128);
  EXPECT_TRUE(absl::IsOutOfRange(PlaceInRegions(table, "alice", overflow, &held, &outputs_to)));
  // The file shrinks after registration: a slice beyond its new end is refused.
  ASSERT_EQ(::truncate(file.c_str(), 1024), 0);
  InferRequest shrunk = ShmRequest("in", 4096, 128);
  EXPECT_TRUE(absl::IsOutOfRange(PlaceInRegions(table, "alice", shrunk, &held, &outputs_to)));
  InferRequest inside = ShmRequest("in", 0, 128);
  EXPECT_TRUE(PlaceInRegions(table, "alice", inside, &held, &outputs_to).ok());
}

TEST(PlaceInRegionsTest, AtMostOneOutputInSharedMemory) {
  ShmDir dir;
  dir.File("seg", 4096);
  RegionTable table;
  TritonRegions regions(&table, dir.path());
  ASSERT_TRUE(regions.RegisterSystem("alice", ::getuid(), "out", "/seg", 0, 4096).ok());
  InferRequest r;
  r.output_regions.emplace_back("a", ShmReference{"out", 0, 64});
  r.output_regions.emplace_back("b", ShmReference{"out", 64, 64});
  std::vector<std::shared_ptr<const dataplane::TransferRegion>> held;
  std::optional<proto::ByteSlice> outputs_to;
  EXPECT_TRUE(absl::IsInvalidArgument(PlaceInRegions(table, "alice", r, &held, &outputs_to)));
}

}  // namespace
}  // namespace pswitch::frontend
