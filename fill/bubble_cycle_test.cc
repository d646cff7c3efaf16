#include "fill/bubble_cycle.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::fill {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

absl::Duration Ms(int64_t ms) { return absl::Milliseconds(ms); }

BubbleCycle TwoBubbles() {
  return BubbleCycle{Ms(100), {{Ms(0), Ms(30), 4 * kGiB}, {Ms(40), Ms(14), 8 * kGiB}}};
}

void ExpectInvalid(const BubbleCycle& cycle, absl::string_view needle) {
  absl::Status status = ValidateBubbleCycle(cycle);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr(needle));
}

TEST(BubbleCycleTest, ValidCycles) {
  EXPECT_TRUE(ValidateBubbleCycle(TwoBubbles()).ok());
  EXPECT_TRUE(ValidateBubbleCycle(BubbleCycle{Ms(100), {}}).ok());
  // Touching bubbles and a bubble ending exactly at the period are fine.
  EXPECT_TRUE(
      ValidateBubbleCycle(BubbleCycle{Ms(100), {{Ms(0), Ms(50), 0}, {Ms(50), Ms(50), 1}}}).ok());
}

TEST(BubbleCycleTest, ValidationNamesTheFieldAndIndex) {
  ExpectInvalid(BubbleCycle{Ms(0), {}}, "period_ns");
  ExpectInvalid(BubbleCycle{absl::InfiniteDuration(), {}}, "period_ns");

  BubbleCycle negative_offset = TwoBubbles();
  negative_offset.bubbles[0].offset = -Ms(1);
  ExpectInvalid(negative_offset, "bubbles[0].offset_ns");

  BubbleCycle zero_duration = TwoBubbles();
  zero_duration.bubbles[1].duration = absl::ZeroDuration();
  ExpectInvalid(zero_duration, "bubbles[1].duration_ns");

  BubbleCycle negative_memory = TwoBubbles();
  negative_memory.bubbles[1].free_bytes = -1;
  ExpectInvalid(negative_memory, "bubbles[1].free_bytes");

  BubbleCycle past_period = TwoBubbles();
  past_period.bubbles[1].duration = Ms(61);
  ExpectInvalid(past_period, "bubbles[1] ends at 101000000 ns, after the period (100000000)");

  BubbleCycle overlapping = TwoBubbles();
  overlapping.bubbles[1].offset = Ms(29);
  ExpectInvalid(overlapping, "bubbles[1].offset_ns 29000000 is before the end of bubbles[0]");

  BubbleCycle unsorted{Ms(100), {{Ms(40), Ms(10), 0}, {Ms(0), Ms(10), 0}}};
  ExpectInvalid(unsorted, "bubbles[1].offset_ns 0 is before the end of bubbles[0]");
}

TEST(BubbleCycleJsonTest, RoundTripsExactly) {
  BubbleCycle cycle = TwoBubbles();
  cycle.bubbles[1].duration = absl::Nanoseconds(14'000'001);  // sub-microsecond survives
  const std::string text = BubbleCycleToJson(cycle).dump();
  EXPECT_EQ(text, R"({"period_ns":100000000,"bubbles":[{"offset_ns":0,"duration_ns":30000000,)"
                  R"("free_bytes":4294967296},{"offset_ns":40000000,"duration_ns":14000001,)"
                  R"("free_bytes":8589934592}]})");
  absl::StatusOr<BubbleCycle> parsed = ParseBubbleCycleJson(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, cycle);
}

TEST(BubbleCycleJsonTest, RejectsMalformedInputNamingTheField) {
  struct Case {
    const char* json;
    const char* error;
  };
  const Case cases[] = {
      {"{", "malformed JSON"},
      {"[]", "must be a JSON object, got array"},
      {R"({"bubbles": []})", "missing 'period_ns'"},
      {R"({"period_ns": 100})", "missing 'bubbles'"},
      {R"({"period_ns": 1.5, "bubbles": []})", "period_ns must be a 64-bit integer, got 1.5"},
      {R"({"period_ns": "100", "bubbles": []})", "period_ns must be a 64-bit integer"},
      {R"({"period_ns": 18446744073709551615, "bubbles": []})", "must be a 64-bit integer"},
      {R"({"period_ns": 100, "bubbles": {}})", "'bubbles' must be an array, got object"},
      {R"({"period_ns": 100, "bubbles": [], "extra": 1})", "unknown field 'extra'"},
      {R"({"period_ns": 100, "bubbles": [7]})", "bubbles[0] must be an object, got number"},
      {R"({"period_ns": 100, "bubbles": [{"offset_ns": 0, "duration_ns": 5}]})",
       "bubbles[0] is missing 'free_bytes'"},
      {R"({"period_ns": 100, "bubbles": [{"offset_ns": 0, "duraton_ns": 5, "free_bytes": 0}]})",
       "bubbles[0] has unknown field 'duraton_ns'"},
      {R"({"period_ns": 100, "bubbles": [{"offset_ns": 0, "duration_ns": true, "free_bytes": 0}]})",
       "bubbles[0].duration_ns must be a 64-bit integer, got true"},
      {R"({"period_ns": 100, "bubbles": [{"offset_ns": 90, "duration_ns": 20, "free_bytes": 0}]})",
       "bubbles[0] ends at 110 ns, after the period (100)"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<BubbleCycle> parsed = ParseBubbleCycleJson(c.json);
    ASSERT_FALSE(parsed.ok()) << c.json;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.error)) << c.json;
  }
}

class BubbleCycleProfilerTest : public ::testing::Test {
 protected:
  absl::Time At(int64_t ms) const { return t0_ + Ms(ms); }
  // The next bubble of the open iteration, at the next schedule position (0, 1, ...).
  void Record(int64_t begin_ms, int64_t end_ms, int64_t free_bytes) {
    RecordAt(next_position_++, begin_ms, end_ms, free_bytes);
  }
  void RecordAt(int position, int64_t begin_ms, int64_t end_ms, int64_t free_bytes) {
    ASSERT_TRUE(profiler_.RecordBubble(position, At(begin_ms), At(end_ms), free_bytes).ok());
  }
  absl::Status StartIteration(int64_t ms) {
    next_position_ = 0;
    return profiler_.StartIteration(At(ms));
  }

  const absl::Time t0_ = absl::FromUnixSeconds(1'700'000'000);
  BubbleCycleProfiler profiler_;
  int next_position_ = 0;
};

TEST_F(BubbleCycleProfilerTest, TakesMedianTimesAndMinimumMemoryPerPosition) {
  // Three iterations of ~100 ms with two bubbles each; iteration 1 is disturbed.
  ASSERT_TRUE(StartIteration(0).ok());
  Record(0, 30, 5 * kGiB);
  Record(40, 54, 8 * kGiB);
  ASSERT_TRUE(StartIteration(100).ok());
  Record(101, 121, 4 * kGiB);  // offset 1, duration 20
  Record(150, 170, 9 * kGiB);  // offset 50, duration 20
  ASSERT_TRUE(StartIteration(230).ok());
  Record(230, 262, 6 * kGiB);  // offset 0, duration 32
  Record(270, 283, 8 * kGiB);  // offset 40, duration 13
  ASSERT_TRUE(StartIteration(332).ok());
  Record(332, 340, 0);  // in the open iteration: ignored
  EXPECT_EQ(profiler_.complete_iterations(), 3);

  absl::StatusOr<BubbleCycle> cycle = profiler_.Build();
  ASSERT_TRUE(cycle.ok()) << cycle.status();
  // periods {100, 130, 102} -> 102; offsets {0,1,0} -> 0 and {40,50,40} -> 40;
  // durations {30,20,32} -> 30 and {14,20,13} -> 14; memory minima 4 GiB and 8 GiB.
  EXPECT_EQ(*cycle,
            (BubbleCycle{Ms(102), {{Ms(0), Ms(30), 4 * kGiB}, {Ms(40), Ms(14), 8 * kGiB}}}));
}

TEST_F(BubbleCycleProfilerTest, EvenCountsUseTheLowerMedian) {
  ASSERT_TRUE(StartIteration(0).ok());
  Record(10, 30, kGiB);
  ASSERT_TRUE(StartIteration(100).ok());
  Record(110, 140, kGiB);
  ASSERT_TRUE(StartIteration(210).ok());
  absl::StatusOr<BubbleCycle> cycle = profiler_.Build();
  ASSERT_TRUE(cycle.ok()) << cycle.status();
  EXPECT_EQ(cycle->period, Ms(100));
  EXPECT_EQ(cycle->bubbles[0].duration, Ms(20));
}

// A wait that comes and goes (here: position 1, seen in 1 of 3 iterations) is left out; one seen
// in most iterations (position 2, missing once) is kept, and neither shifts the other bubbles.
TEST_F(BubbleCycleProfilerTest, BubblesAreMatchedBySchedulePositionNotByRank) {
  ASSERT_TRUE(StartIteration(0).ok());
  RecordAt(0, 0, 30, kGiB);
  RecordAt(1, 35, 36, kGiB);  // a just-in-time wait, this iteration only
  RecordAt(2, 60, 80, kGiB);
  ASSERT_TRUE(StartIteration(100).ok());
  RecordAt(0, 100, 130, kGiB);
  // position 2's message was already waiting: no bubble
  ASSERT_TRUE(StartIteration(200).ok());
  RecordAt(0, 200, 230, kGiB);
  RecordAt(2, 260, 282, kGiB);
  ASSERT_TRUE(StartIteration(300).ok());
  absl::StatusOr<BubbleCycle> cycle = profiler_.Build();
  ASSERT_TRUE(cycle.ok()) << cycle.status();
  EXPECT_EQ(*cycle, (BubbleCycle{Ms(100), {{Ms(0), Ms(30), kGiB}, {Ms(60), Ms(20), kGiB}}}));
  // One iteration may not hold two bubbles at one position.
  EXPECT_EQ(profiler_.RecordBubble(0, At(300), At(301), 0).code(), absl::StatusCode::kOk);
  EXPECT_EQ(profiler_.RecordBubble(0, At(302), At(303), 0).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BubbleCycleProfilerTest, NeedsACompleteIteration) {
  EXPECT_EQ(profiler_.Build().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(StartIteration(0).ok());
  Record(0, 30, kGiB);
  EXPECT_EQ(profiler_.complete_iterations(), 0);
  EXPECT_EQ(profiler_.Build().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(BubbleCycleProfilerTest, RejectsEventsThatDoNotFitTheIterations) {
  EXPECT_EQ(profiler_.RecordBubble(0, At(0), At(1), 0).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(StartIteration(100).ok());
  EXPECT_EQ(profiler_.RecordBubble(0, At(99), At(110), 0).code(),
            absl::StatusCode::kInvalidArgument);  // straddles the iteration start
  EXPECT_EQ(profiler_.RecordBubble(0, At(110), At(110), 0).code(),
            absl::StatusCode::kInvalidArgument);  // empty
  EXPECT_EQ(profiler_.RecordBubble(0, At(110), At(120), -1).code(),
            absl::StatusCode::kInvalidArgument);
  Record(110, 120, 0);
  EXPECT_EQ(profiler_.RecordBubble(0, At(115), At(125), 0).code(),
            absl::StatusCode::kInvalidArgument);  // overlaps the previous bubble
  EXPECT_EQ(StartIteration(100).code(), absl::StatusCode::kInvalidArgument);
  absl::Status inside = StartIteration(115);
  EXPECT_EQ(inside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(inside.message(), HasSubstr("must not fall inside a bubble"));
}

TEST_F(BubbleCycleProfilerTest, MediansThatDoNotFormACycleAreReported) {
  // Each iteration is consistent on its own, but the medians are not: period median 60 ms
  // {60, 60, 200}, offset median 50 ms {50, 0, 100}, duration median 60 ms {10, 60, 100}.
  ASSERT_TRUE(StartIteration(0).ok());
  Record(50, 60, kGiB);
  ASSERT_TRUE(StartIteration(60).ok());
  Record(60, 120, kGiB);
  ASSERT_TRUE(StartIteration(120).ok());
  Record(220, 320, kGiB);
  ASSERT_TRUE(StartIteration(320).ok());
  absl::StatusOr<BubbleCycle> cycle = profiler_.Build();
  EXPECT_EQ(cycle.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cycle.status().message(), HasSubstr("the medians do not form a cycle"));
  EXPECT_THAT(cycle.status().message(), HasSubstr("after the period"));
}

}  // namespace
}  // namespace pswitch::fill
