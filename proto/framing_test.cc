#include "proto/framing.h"

#include <cstring>

#include "gtest/gtest.h"
#include "proto/client_generated.h"
#include "proto/memdaemon_generated.h"
#include "proto/worker_generated.h"

namespace pswitch::proto {
namespace {

std::vector<uint8_t> AttachPayload(uint32_t worker_id) {
  flatbuffers::FlatBufferBuilder b;
  auto attach = CreateAttachArena(b, worker_id, 1234);
  proto::Finish(b, CreateMemRequest(b, 7, MemRequestBody::AttachArena, attach.Union()));
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

TEST(FramingTest, RoundTripsFramesSplitAcrossArbitraryReads) {
  std::vector<uint8_t> stream;
  for (uint32_t i = 0; i < 5; ++i) {
    auto frame = EncodeFrame(AttachPayload(i));
    ASSERT_TRUE(frame.ok());
    EXPECT_EQ((*frame)[0] + ((*frame)[1] << 8), static_cast<int>(frame->size() - 4));
    stream.insert(stream.end(), frame->begin(), frame->end());
  }
  FrameDecoder decoder;
  uint32_t seen = 0;
  // Feed 3 bytes at a time so headers and payloads straddle reads.
  for (size_t pos = 0; pos < stream.size(); pos += 3) {
    size_t n = std::min<size_t>(3, stream.size() - pos);
    decoder.Append(std::span<const uint8_t>(stream.data() + pos, n));
    while (true) {
      auto next = decoder.Next();
      ASSERT_TRUE(next.ok()) << next.status();
      if (!next->has_value()) break;
      auto request = VerifyPayload<MemRequest>(**next, "memdaemon request");
      ASSERT_TRUE(request.ok()) << request.status();
      EXPECT_EQ((*request)->body_as_AttachArena()->worker_id(), seen);
      ++seen;
    }
  }
  EXPECT_EQ(seen, 5u);
}

TEST(FramingTest, RejectsZeroAndOversizeLengthsAndStaysFailed) {
  FrameDecoder zero;
  const uint8_t zero_header[4] = {0, 0, 0, 0};
  zero.Append(zero_header);
  EXPECT_EQ(zero.Next().status().code(), absl::StatusCode::kInvalidArgument);

  FrameDecoder small(/*max_frame_bytes=*/16);
  const uint8_t big_header[4] = {17, 0, 0, 0};
  small.Append(big_header);
  auto next = small.Next();
  EXPECT_EQ(next.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(next.status().message().find("exceeds the maximum of 16"), absl::string_view::npos);
  // A failed stream never resynchronises on later bytes.
  const uint8_t ok_header[4] = {1, 0, 0, 0};
  small.Append(ok_header);
  EXPECT_FALSE(small.Next().ok());
}

TEST(FramingTest, EncodeRejectsEmptyAndOversizePayloads) {
  EXPECT_FALSE(EncodeFrame(std::span<const uint8_t>()).ok());
  std::vector<uint8_t> big(33);
  EXPECT_EQ(EncodeFrame(big, 32).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(EncodeFrame(big, 33).ok());
}

TEST(FramingTest, VerifierRejectsGarbageAndTruncation) {
  std::vector<uint8_t> garbage = {0xff, 0xff, 0xff, 0x7f, 1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(VerifyPayload<MemRequest>(garbage, "memdaemon request").status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> good = AttachPayload(3);
  EXPECT_TRUE(VerifyPayload<MemRequest>(good, "memdaemon request").ok());
  for (size_t cut = 0; cut < good.size(); cut += 4) {
    std::vector<uint8_t> truncated(good.begin(), good.begin() + cut);
    EXPECT_FALSE(VerifyPayload<MemRequest>(truncated, "memdaemon request").ok()) << cut;
  }
  std::vector<uint8_t> tiny = {1};
  EXPECT_FALSE(VerifyPayload<MemRequest>(tiny, "memdaemon request").ok());
}

TEST(FramingTest, VerifierRejectsMissingRequiredUnion) {
  flatbuffers::FlatBufferBuilder b;
  MemRequestBuilder rb(b);
  rb.add_request_id(1);
  Finish(b, rb.Finish());  // identifier right, union missing
  std::vector<uint8_t> payload(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  EXPECT_FALSE(VerifyPayload<MemRequest>(payload, "memdaemon request").ok());
}

// Trust-boundary issue, item 9: a ControllerReply Ack verified as a ClientRequest (BubbleEnd).
// Each root message type carries its own identifier now.
TEST(FramingTest, AFrameOfAnotherMessageTypeFailsVerification) {
  flatbuffers::FlatBufferBuilder b;
  auto ack = CreateAck(b);
  Finish(b, CreateControllerReply(b, 7, ControllerReplyBody::Ack, ack.Union()));
  std::vector<uint8_t> reply(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  EXPECT_TRUE(VerifyPayload<ControllerReply>(reply, "reply").ok());
  EXPECT_FALSE(VerifyPayload<ClientRequest>(reply, "client request").ok());
  EXPECT_FALSE(VerifyPayload<WorkerEvent>(reply, "worker event").ok());
  // The same bytes without any identifier are refused too.
  flatbuffers::FlatBufferBuilder bare;
  auto end = CreateBubbleEnd(bare, 0);
  bare.Finish(CreateClientRequest(bare, 1, ClientRequestBody::BubbleEnd, end.Union()));
  std::vector<uint8_t> unmarked(bare.GetBufferPointer(), bare.GetBufferPointer() + bare.GetSize());
  EXPECT_FALSE(VerifyPayload<ClientRequest>(unmarked, "client request").ok());
}

}  // namespace
}  // namespace pswitch::proto
