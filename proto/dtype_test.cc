#include "proto/dtype.h"

#include <iterator>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "proto/host_tensor.h"

namespace pswitch::proto {
namespace {

TEST(DTypeTableTest, EveryWireDTypeHasOneRowAndEveryNameFindsIt) {
  for (DType dtype : EnumValuesDType()) {
    const DTypeInfo* info = FindDType(dtype);
    ASSERT_NE(info, nullptr) << EnumNameDType(dtype) << " has no row";
    EXPECT_EQ(info->wire, dtype);
    EXPECT_GT(info->bytes, 0u);
    EXPECT_EQ(DTypeByName(info->name), info);
    EXPECT_EQ(DTypeByKserve(info->kserve), info);
    EXPECT_EQ(DTypeByTorch(info->torch_scalar_type), info);
    if (info->numpy != nullptr) {
      EXPECT_EQ(DTypeByNumpy(info->numpy), info);
    }
    // The wire's own name for it is safetensors' spelling.
    EXPECT_EQ(std::string(info->name), EnumNameDType(dtype));
  }
  EXPECT_EQ(kDTypes.size(), std::size(EnumValuesDType()));
  std::set<std::string> names, kserve;
  for (const DTypeInfo& row : kDTypes) {
    EXPECT_TRUE(names.insert(row.name).second) << row.name;
    EXPECT_TRUE(kserve.insert(row.kserve).second) << row.kserve;
  }
  EXPECT_EQ(FindDType(static_cast<DType>(200)), nullptr);  // a hostile message's value
  EXPECT_EQ(DTypeByKserve("FP64"), nullptr);
  EXPECT_EQ(DTypeByNumpy("float64"), nullptr);
  EXPECT_EQ(DTypeBytes(static_cast<DType>(200)), 0u);
}

}  // namespace
}  // namespace pswitch::proto
