// Tests of stage messages: framing, validation of what arrives, the link reader, control codecs.
#include "pipeline/wire.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipeline/internal/control.h"
#include "pipeline/link_reader.h"
#include "base/unique_fd.h"

namespace pswitch::pipeline {
namespace {

using ::testing::HasSubstr;

std::pair<UniqueFd, UniqueFd> Pair() {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

Message Activation(int iteration, int microbatch, std::vector<int64_t> shape) {
  Message m{MessageKind::kActivation, iteration, microbatch, {WireDType::kF32, shape, {}}};
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  m.tensor.data.resize(n * sizeof(float));
  for (int64_t i = 0; i < n; ++i) {
    const float v = 0.5f * static_cast<float>(i);
    std::memcpy(m.tensor.data.data() + i * sizeof(float), &v, sizeof(float));
  }
  return m;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

TEST(WireTest, TensorRoundTripsWithItsHeader) {
  auto [a, b] = Pair();
  const Message sent = Activation(3, 2, {2, 3, 4});
  ASSERT_TRUE(SendMessage(a.get(), sent, Soon()).ok());
  auto got = ReceiveMessage(b.get(), kDefaultMaxPayloadBytes, Soon());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kind, MessageKind::kActivation);
  EXPECT_EQ(got->iteration, 3);
  EXPECT_EQ(got->microbatch, 2);
  EXPECT_EQ(got->tensor.shape, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(got->tensor.data, sent.tensor.data);
  EXPECT_TRUE(
      ExpectMessage(*got, "link", MessageKind::kActivation, 3, 2, {WireDType::kF32, {2, 3, 4}})
          .ok());
}

TEST(WireTest, UnexpectedShapeOrMicrobatchIsNamed) {
  const Message m = Activation(0, 1, {2, 8});
  absl::Status shape = ExpectMessage(m, "link from stage 0", MessageKind::kActivation, 0, 1,
                                     {WireDType::kF32, {2, 9}});
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(shape.message()), HasSubstr("expected f32[2, 9], got f32[2, 8]"));
  absl::Status order = ExpectMessage(m, "link from stage 0", MessageKind::kActivation, 0, 0,
                                     {WireDType::kF32, {2, 8}});
  EXPECT_THAT(std::string(order.message()), HasSubstr("micro-batch 0, got the activation"));
}

TEST(WireTest, SenderRefusesDataThatDisagreesWithShape) {
  auto [a, b] = Pair();
  Message m = Activation(0, 0, {4});
  m.tensor.data.pop_back();
  EXPECT_EQ(SendMessage(a.get(), m, Soon()).code(), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, MalformedHeadersAreRejectedBeforeThePayload) {
  auto [a, b] = Pair();
  // A header claiming a payload far above the receiver's limit is refused without reading it.
  ASSERT_TRUE(SendMessage(a.get(), Activation(0, 0, {1024}), Soon()).ok());
  auto big = ReceiveMessage(b.get(), /*max_payload_bytes=*/1024, Soon());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("exceeds the limit"));

  auto [c, d] = Pair();
  std::string garbage(80, 'x');
  ASSERT_EQ(::write(c.get(), garbage.data(), garbage.size()), 80);
  auto bad = ReceiveMessage(d.get(), kDefaultMaxPayloadBytes, Soon());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("bad message header"));
}

TEST(WireTest, PeerCloseAtBoundaryAndMidMessageAreDistinct) {
  auto [a, b] = Pair();
  a.Reset();
  EXPECT_EQ(ReceiveMessage(b.get(), kDefaultMaxPayloadBytes, Soon()).status().code(),
            absl::StatusCode::kUnavailable);
  auto [c, d] = Pair();
  ASSERT_EQ(::write(c.get(), "PSPL", 4), 4);
  c.Reset();
  EXPECT_EQ(ReceiveMessage(d.get(), kDefaultMaxPayloadBytes, Soon()).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(WireTest, ReceiveTimesOut) {
  auto [a, b] = Pair();
  auto r = ReceiveMessage(b.get(), kDefaultMaxPayloadBytes, absl::Now() + absl::Milliseconds(20));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(LinkReaderTest, DeliversInOrderThenReportsTheClosedPeer) {
  auto [a, b] = Pair();
  LinkReader reader(b.get(), "link from stage 0", kDefaultMaxPayloadBytes, 8);
  for (int m = 0; m < 3; ++m) ASSERT_TRUE(SendMessage(a.get(), Activation(0, m, {4}), Soon()).ok());
  a.Reset();
  for (int m = 0; m < 3; ++m) {
    auto got = reader.Take(absl::Seconds(5));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->microbatch, m);
  }
  auto closed = reader.Take(absl::Seconds(5));
  EXPECT_EQ(closed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(closed.status().message()), HasSubstr("link from stage 0: peer closed"));
}

TEST(LinkReaderTest, TakeTimesOut) {
  auto [a, b] = Pair();
  LinkReader reader(b.get(), "link", kDefaultMaxPayloadBytes, 2);
  EXPECT_FALSE(reader.HasMessage());
  EXPECT_EQ(reader.Take(absl::Milliseconds(10)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(LinkReaderTest, MessagesBeyondTheQueueLimitFailTheLink) {
  auto [a, b] = Pair();
  // With no room at all, the first message is already one too many (deterministic, unlike
  // racing the reader thread with a larger limit).
  LinkReader reader(b.get(), "link from stage 3", kDefaultMaxPayloadBytes, 0);
  ASSERT_TRUE(SendMessage(a.get(), Activation(0, 0, {1}), Soon()).ok());
  auto flooded = reader.Take(absl::Seconds(5));
  EXPECT_EQ(flooded.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(flooded.status().message()), HasSubstr("link from stage 3"));
}

TEST(ControlTest, StatsRoundTripAndGarbageIsRejected) {
  StageIterationStats s;
  s.stage = 2;
  s.finish = absl::Milliseconds(120);
  s.forward = absl::Milliseconds(40);
  s.backward = absl::Milliseconds(80);
  s.step = absl::Microseconds(3);
  s.peak_in_flight = 3;
  s.loss = std::nan("");
  s.waits = {{1, absl::Milliseconds(5), absl::Milliseconds(7), absl::Milliseconds(6)}};
  auto back = internal::DecodeStats(internal::EncodeStats(s));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->stage, 2);
  EXPECT_EQ(back->finish, s.finish);
  EXPECT_EQ(back->peak_in_flight, 3);
  EXPECT_TRUE(std::isnan(back->loss));
  ASSERT_EQ(back->waits.size(), 1u);
  EXPECT_EQ(back->waits[0].duration, absl::Milliseconds(7));
  EXPECT_EQ(back->waits[0].expected, absl::Milliseconds(6));

  EXPECT_FALSE(internal::DecodeStats("{\"stage\": 1}").ok());
  EXPECT_FALSE(internal::DecodeStats("not json").ok());
  EXPECT_FALSE(internal::DecodePlan(internal::EncodePlan({{}, {}}), 3).ok());
  absl::Status error = internal::DecodeError(
      internal::EncodeError(absl::UnavailableError("link from stage 1: peer closed")));
  EXPECT_EQ(error.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(error.message(), "link from stage 1: peer closed");
}

}  // namespace
}  // namespace pswitch::pipeline
