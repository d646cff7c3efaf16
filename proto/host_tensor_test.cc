#include "proto/host_tensor.h"

#include "gtest/gtest.h"

namespace pswitch::proto {
namespace {

TEST(HostTensorTest, RoundTripsThroughTheWire) {
  HostTensor t{"input", DType::F32, {2, 3}, std::vector<uint8_t>(24, 7)};
  flatbuffers::FlatBufferBuilder b;
  b.Finish(CreateWireTensor(b, t));
  auto back = FromWireTensor(*flatbuffers::GetRoot<Tensor>(b.GetBufferPointer()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->name, "input");
  EXPECT_EQ(back->shape, t.shape);
  EXPECT_EQ(back->data, t.data);
}

TEST(HostTensorTest, RejectsInconsistentTensorsNamingThem) {
  HostTensor short_data{"x", DType::I64, {4}, std::vector<uint8_t>(31)};
  auto status = ValidateHostTensor(short_data);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'x'"), absl::string_view::npos);
  EXPECT_FALSE(ValidateHostTensor({"n", DType::F32, {-1}, {}}).ok());
  EXPECT_FALSE(
      ValidateHostTensor({"d", DType::F32, std::vector<int64_t>(9, 1), {0, 0, 0, 0}}).ok());
  EXPECT_FALSE(
      ValidateHostTensor({"o", DType::F32, {INT64_MAX, INT64_MAX}, std::vector<uint8_t>(4)}).ok());
  EXPECT_FALSE(ValidateHostTensor({"u", static_cast<DType>(99), {1}, {0}}).ok());
  EXPECT_TRUE(ValidateHostTensor({"e", DType::BF16, {0, 5}, {}}).ok());
}

}  // namespace
}  // namespace pswitch::proto
