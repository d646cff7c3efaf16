#include "proto/framing.h"

#include <algorithm>
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

std::vector<uint8_t> Pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(seed + i * 31 + (i >> 12));
  return out;
}

TEST(FramingTest, EncodeFrameHeaderIsTheFramesFirstFourBytes) {
  std::vector<uint8_t> payload = Pattern(70000, 3);
  auto frame = EncodeFrame(payload);
  auto header = EncodeFrameHeader(payload.size());
  ASSERT_TRUE(frame.ok() && header.ok());
  EXPECT_TRUE(std::equal(header->begin(), header->end(), frame->begin()));
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), frame->begin() + 4));
  EXPECT_FALSE(EncodeFrameHeader(0).ok());
  EXPECT_EQ(EncodeFrameHeader(33, 32).status().code(), absl::StatusCode::kInvalidArgument);
}

// Large and small frames interleaved, fed in odd-sized chunks: each large payload is received
// into its own vector (whole, in order) and the small frames around it are unaffected.
TEST(FramingTest, LargeFramesSplitAcrossReadsDecodeExactly) {
  std::vector<std::vector<uint8_t>> payloads = {Pattern(10, 1), Pattern(3 << 20, 2),
                                                Pattern(FrameDecoder::kDirectBodyBytes, 3),
                                                Pattern(5, 4), Pattern(200000, 5)};
  std::vector<uint8_t> stream;
  for (const auto& p : payloads) {
    auto frame = EncodeFrame(p);
    ASSERT_TRUE(frame.ok());
    stream.insert(stream.end(), frame->begin(), frame->end());
  }
  for (size_t chunk : {size_t{3}, size_t{4099}, size_t{65536}, stream.size()}) {
    FrameDecoder decoder;
    std::vector<std::vector<uint8_t>> got;
    for (size_t pos = 0; pos < stream.size(); pos += chunk) {
      const size_t n = std::min(chunk, stream.size() - pos);
      decoder.Append(std::span<const uint8_t>(stream.data() + pos, n));
      while (true) {
        auto next = decoder.Next();
        ASSERT_TRUE(next.ok()) << next.status();
        if (!next->has_value()) break;
        got.push_back(std::move(**next));
      }
    }
    ASSERT_EQ(got.size(), payloads.size()) << "chunk " << chunk;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], payloads[i]) << i;
    EXPECT_EQ(decoder.buffered(), 0u);
  }
}

// The receive buffer is kept between small frames (no free and re-fault per frame), a large
// frame never passes through it, and a burst that grew it past the cap gives the memory back.
TEST(FramingTest, TheReceiveBufferIsReusedAndBounded) {
  FrameDecoder decoder;
  auto small = EncodeFrame(Pattern(1000, 9));
  ASSERT_TRUE(small.ok());
  decoder.Append(*small);
  ASSERT_TRUE(decoder.Next()->has_value());
  const size_t kept = decoder.retained_bytes();
  EXPECT_GT(kept, 0u);  // cleared, not freed
  EXPECT_LE(kept, FrameDecoder::kKeptBufferBytes);
  for (int i = 0; i < 100; ++i) {
    decoder.Append(*small);
    ASSERT_TRUE(decoder.Next()->has_value());
    EXPECT_EQ(decoder.retained_bytes(), kept) << i;
  }
  // A large frame goes straight to its payload: afterwards only the small buffer is held.
  auto large = EncodeFrame(Pattern(8 << 20, 1));
  ASSERT_TRUE(large.ok());
  for (size_t pos = 0; pos < large->size(); pos += 65536) {
    decoder.Append(std::span<const uint8_t>(large->data() + pos,
                                            std::min<size_t>(65536, large->size() - pos)));
    EXPECT_LE(decoder.buffered(), pos + 65536);  // what arrived, never the declared size
  }
  auto payload = decoder.Next();
  ASSERT_TRUE(payload.ok() && payload->has_value());
  EXPECT_EQ((*payload)->size(), size_t{8} << 20);
  EXPECT_LE(decoder.retained_bytes(), FrameDecoder::kKeptBufferBytes);
  // A burst of 2 MiB of small frames in one read grows the buffer; once they are all taken the
  // decoder is between frames and holds at most the cap again.
  std::vector<uint8_t> burst;
  for (int i = 0; i < 2000; ++i) burst.insert(burst.end(), small->begin(), small->end());
  decoder.Append(*small);  // the first frame's header routes the rest behind it
  decoder.Append(burst);
  int frames = 0;
  while (true) {
    auto next = decoder.Next();
    ASSERT_TRUE(next.ok());
    if (!next->has_value()) break;
    ++frames;
  }
  EXPECT_EQ(frames, 2001);
  EXPECT_LE(decoder.retained_bytes(), FrameDecoder::kKeptBufferBytes);
}

// A recycled payload's memory receives the next large frame (already faulted in), and the
// kept spare is bounded.
TEST(FramingTest, ARecycledPayloadReceivesTheNextLargeFrame) {
  FrameDecoder decoder;
  auto first = EncodeFrame(Pattern(4 << 20, 1));
  auto second = EncodeFrame(Pattern(3 << 20, 2));
  ASSERT_TRUE(first.ok() && second.ok());
  decoder.Append(*first);
  auto one = decoder.Next();
  ASSERT_TRUE(one.ok() && one->has_value());
  const uint8_t* memory = (*one)->data();
  decoder.Recycle(std::move(**one));
  decoder.Append(*second);
  auto two = decoder.Next();
  ASSERT_TRUE(two.ok() && two->has_value());
  EXPECT_EQ((*two)->data(), memory);
  EXPECT_EQ(**two, Pattern(3 << 20, 2));
  // Beyond the cap a spare is not kept; Discard frees everything.
  decoder.Recycle(std::vector<uint8_t>(FrameDecoder::kKeptSpareBytes + 1));
  EXPECT_LE(decoder.retained_bytes(), FrameDecoder::kKeptBufferBytes);
  decoder.Recycle(std::move(**two));
  EXPECT_GT(decoder.retained_bytes(), size_t{3} << 20);
  decoder.Discard();
  EXPECT_EQ(decoder.retained_bytes(), 0u);
}

// In-place receiving: the offered space never crosses the frame's end (fd-per-frame), and the
// payload comes out whole.
TEST(FramingTest, ReceiveSpaceNeverCrossesAFrameBoundary) {
  std::vector<uint8_t> stream;
  std::vector<std::vector<uint8_t>> payloads = {Pattern(300, 1), Pattern(3 << 20, 2),
                                                Pattern(2, 3)};
  std::vector<size_t> ends;
  for (const auto& p : payloads) {
    auto frame = EncodeFrame(p);
    stream.insert(stream.end(), frame->begin(), frame->end());
    ends.push_back(stream.size());
  }
  FrameDecoder decoder;
  size_t pos = 0, frame = 0;
  while (frame < payloads.size()) {
    auto next = decoder.Next();
    ASSERT_TRUE(next.ok());
    if (next->has_value()) {
      EXPECT_EQ(**next, payloads[frame]);
      ++frame;
      continue;
    }
    std::span<uint8_t> space = decoder.ReceiveSpace();
    ASSERT_FALSE(space.empty());
    ASSERT_LE(pos + space.size(), ends[frame]) << "offered space crosses frame " << frame;
    // A short read: only part of what was offered arrives.
    const size_t n = std::min(space.size(), std::max<size_t>(1, space.size() / 2 + 1));
    std::memcpy(space.data(), stream.data() + pos, n);
    decoder.Commit(n);
    pos += n;
  }
  EXPECT_EQ(pos, stream.size());
  EXPECT_EQ(decoder.buffered(), 0u);
  // Space offered and never committed holds no bytes: asking again offers the same place.
  ASSERT_EQ(decoder.ReceiveSpace().size(), kFrameHeaderBytes);
  ASSERT_EQ(decoder.ReceiveSpace().size(), kFrameHeaderBytes);
  EXPECT_EQ(decoder.buffered(), 0u);
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
