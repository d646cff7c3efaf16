#include "proto/wire_status.h"

#include "gtest/gtest.h"

namespace pswitch::proto {
namespace {

TEST(WireStatusTest, EveryCanonicalCodeRoundTrips) {
  for (int c = 1; c <= 16; ++c) {
    absl::Status status(static_cast<absl::StatusCode>(c), "model 'x': something");
    flatbuffers::FlatBufferBuilder b;
    b.Finish(CreateWireError(b, status));
    auto* error = flatbuffers::GetRoot<Error>(b.GetBufferPointer());
    EXPECT_EQ(FromWireError(error), status);
  }
}

TEST(WireStatusTest, OkOrMissingErrorIsNeverSuccess) {
  EXPECT_EQ(FromWireError(nullptr).code(), absl::StatusCode::kUnknown);
  flatbuffers::FlatBufferBuilder b;
  b.Finish(CreateError(b, ErrorCode::Ok, b.CreateString("odd")));
  EXPECT_EQ(FromWireError(flatbuffers::GetRoot<Error>(b.GetBufferPointer())).code(),
            absl::StatusCode::kUnknown);
}

}  // namespace
}  // namespace pswitch::proto
