#include "dataplane/region_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace pswitch::dataplane {
namespace {

std::shared_ptr<const TransferRegion> Area(const std::string& owner, uint64_t bytes = 4096) {
  UniqueFd fd(::memfd_create("test-area", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
  EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
  auto r = TransferRegion::FromSealedMemfd(std::move(fd), bytes, owner);
  EXPECT_TRUE(r.ok());
  return *r;
}

TEST(RegionTableTest, AnotherPrincipalsRegionLooksMissing) {
  RegionTable table;
  auto mine = Area("alice");
  ASSERT_TRUE(table.Add("in", mine).ok());
  EXPECT_EQ(*table.Find("alice", mine->id()), mine);
  EXPECT_EQ(*table.FindByName("alice", "in"), mine);
  const absl::Status foreign = table.Find("bob", mine->id()).status();
  const absl::Status missing = table.Find("bob", mine->id() + 1000).status();
  EXPECT_EQ(foreign.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.FindByName("bob", "in").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Remove("bob", mine->id()).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(table.FindByName("alice", "in").ok());
  // Names are each principal's own.
  EXPECT_TRUE(table.Add("in", Area("bob")).ok());
  EXPECT_EQ(table.Add("in", Area("alice")).code(), absl::StatusCode::kAlreadyExists);
}

TEST(RegionTableTest, CountAndBytesAreBoundedPerPrincipal) {
  RegionTable table({.max_regions_per_principal = 3, .max_bytes_per_principal = 3 * 4096});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(table.Add("", Area("alice")).ok());
  EXPECT_EQ(table.Add("", Area("alice")).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(table.Add("", Area("bob", 2 * 4096)).ok());
  EXPECT_EQ(table.Add("", Area("bob", 2 * 4096)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(table.Add("", Area("bob", 4096)).ok());
  EXPECT_EQ(table.size(), 5u);
}

TEST(RegionTableTest, TenThousandRegistrationsStayBounded) {
  RegionTable table({.max_regions_per_principal = 64, .max_bytes_per_principal = 1ull << 40});
  int refused = 0;
  for (int i = 0; i < 10000; ++i) {
    if (!table.Add(std::to_string(i), Area("mallory")).ok()) ++refused;
  }
  EXPECT_EQ(refused, 10000 - 64);
  EXPECT_EQ(table.size(), 64u);
  table.RemoveAll("mallory", RegionKind::kSealedMemfd);
  EXPECT_EQ(table.size(), 0u);
}

TEST(RegionTableTest, RemovingFreesTheBudgetButTasksKeepTheRegion) {
  RegionTable table({.max_regions_per_principal = 1, .max_bytes_per_principal = 4096});
  auto area = Area("alice");
  ASSERT_TRUE(table.Add("", area).ok());
  std::shared_ptr<const TransferRegion> held = *table.Find("alice", area->id());
  area.reset();
  ASSERT_TRUE(table.Remove("alice", held->id()).ok());
  EXPECT_TRUE(held->CheckSlice(0, 4096).ok());  // a task's reference outlives the table's
  EXPECT_TRUE(table.Add("", Area("alice")).ok());
  table.RemoveIds("alice", {held->id(), 999999});
  EXPECT_EQ(table.size(), 1u);
}

}  // namespace
}  // namespace pswitch::dataplane
