#include "proto/host_tensor.h"

#include <cstring>
#include <vector>

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

// Found by fuzz/fuzz_frames (UBSan: misaligned 8-byte load): FlatBuffers' verifier checks only
// a vector's 4-byte length prefix for alignment, so a crafted Tensor can carry its [long] shape
// 4 bytes off an 8-byte boundary. It must still be read, without a misaligned load (which this
// test shows only under a sanitizer; fuzz/corpus/fuzz_frames/regression_misaligned_shape, the
// fuzzer's input, replays it under UBSan).
TEST(HostTensorTest, ReadsAShapeVectorOffItsAlignment) {
  for (int pad = 0; pad < 2; ++pad) {
    flatbuffers::FlatBufferBuilder b;
    auto name = b.CreateString("x");
    auto data = b.CreateVector(std::vector<uint8_t>(24, 7));
    for (int i = 0; i < pad; ++i) b.PushElement<uint32_t>(0);
    // Two int64 dims {2, 3}, written as four uint32 words so only 4-byte alignment applies
    // (the builder writes back to front).
    b.StartVector(4, sizeof(uint32_t));
    for (uint32_t word : {0u, 3u, 0u, 2u}) b.PushElement<uint32_t>(word);
    auto shape = flatbuffers::Offset<flatbuffers::Vector<int64_t>>(b.EndVector(2));
    b.Finish(CreateTensor(b, name, DType::F32, shape, data));
    // An 8-byte-aligned copy, as a received frame's payload is.
    std::vector<uint64_t> storage((b.GetSize() + 7) / 8);
    std::memcpy(storage.data(), b.GetBufferPointer(), b.GetSize());
    const auto* buffer = reinterpret_cast<const uint8_t*>(storage.data());
    flatbuffers::Verifier verifier(buffer, b.GetSize());
    ASSERT_TRUE(verifier.VerifyBuffer<Tensor>(nullptr));
    const Tensor* tensor = flatbuffers::GetRoot<Tensor>(buffer);
    if ((tensor->shape()->Data() - buffer) % 8 != 4) continue;  // aligned after all: try a pad

    auto back = FromWireTensor(*tensor);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(back->data, std::vector<uint8_t>(24, 7));
    return;
  }
  FAIL() << "could not place the shape off its alignment";
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

HostTensor Placed(Place place, ByteSlice slice, std::vector<int64_t> shape = {2, 3}) {
  HostTensor t{"p", DType::F32, std::move(shape), {}};
  t.place = place;
  t.slice = slice;
  return t;
}

TEST(HostTensorTest, PlacedTensorsAreCheckedAgainstTheirSliceAndSurviveTheWire) {
  EXPECT_TRUE(ValidateHostTensor(Placed(Place::Region, {7, 64, 24})).ok());
  EXPECT_TRUE(ValidateHostTensor(Placed(Place::Payload, {0, 0, 24})).ok());
  EXPECT_FALSE(ValidateHostTensor(Placed(Place::Region, {7, 64, 23})).ok());
  EXPECT_FALSE(ValidateHostTensor(Placed(Place::Payload, {3, 0, 24})).ok());  // names a region
  EXPECT_FALSE(ValidateHostTensor(Placed(Place::Region, {7, UINT64_MAX - 8, 24})).ok());
  EXPECT_FALSE(ValidateHostTensor(Placed(static_cast<Place>(9), {7, 0, 24})).ok());
  HostTensor both = Placed(Place::Region, {7, 0, 24});
  both.data.resize(24);
  EXPECT_FALSE(ValidateHostTensor(both).ok());
  HostTensor inline_with_slice{"i", DType::F32, {1}, std::vector<uint8_t>(4)};
  inline_with_slice.slice = {1, 0, 4};
  EXPECT_FALSE(ValidateHostTensor(inline_with_slice).ok());
  EXPECT_EQ(ByteLength(Placed(Place::Region, {7, 64, 24})), 24u);

  flatbuffers::FlatBufferBuilder b;
  b.Finish(CreateWireTensor(b, Placed(Place::Region, {7, 64, 24})));
  auto back = FromWireTensor(*flatbuffers::GetRoot<Tensor>(b.GetBufferPointer()));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->place, Place::Region);
  EXPECT_EQ(back->slice, (ByteSlice{7, 64, 24}));
  EXPECT_TRUE(back->data.empty());
}

}  // namespace
}  // namespace pswitch::proto
