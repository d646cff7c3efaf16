#include "controller/telemetry.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pswitch::controller {
namespace {

// The trace's "bubbles" events of GPU `gpu` (pid), in the order recorded.
std::vector<nlohmann::json> Bubbles(const Telemetry& telemetry, int gpu) {
  const nlohmann::json trace = nlohmann::json::parse(
      telemetry.trace().ChromeJson(absl::Seconds(10), base::MonotonicNowNs()));
  std::vector<nlohmann::json> bubbles;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["cat"] == "bubble" && e["pid"] == gpu) bubbles.push_back(e);
  }
  return bubbles;
}

// A bubble a resident fill run lived through carries what the run completed in it, so the share
// used can be read bubble by bubble; one whose use is not known at its end carries nothing.
TEST(TelemetryTest, ABubbleOnTheTraceCarriesWhatAResidentRunCompletedInIt) {
  Telemetry telemetry;
  telemetry.AddGpu(1);
  telemetry.BubbleTime(1, absl::Milliseconds(13),
                       Telemetry::BubbleUse{absl::Microseconds(7250), 1});
  telemetry.BubbleTime(1, absl::Milliseconds(100));
  telemetry.BubbleTime(1, absl::ZeroDuration(), Telemetry::BubbleUse{});  // no bubble: nothing
  std::vector<nlohmann::json> bubbles = Bubbles(telemetry, 1);
  ASSERT_EQ(bubbles.size(), 2u);
  // In the order they began: the 100 ms bubble first.
  EXPECT_NEAR(bubbles[0]["dur"].get<double>(), 100'000, 1e-6);  // microseconds
  EXPECT_FALSE(bubbles[0]["args"].is_object() && bubbles[0]["args"].contains("fill_ms"));
  EXPECT_NEAR(bubbles[1]["dur"].get<double>(), 13'000, 1e-6);
  ASSERT_TRUE(bubbles[1]["args"].is_object());
  double fill_ms = 0;
  ASSERT_TRUE(absl::SimpleAtod(bubbles[1]["args"]["fill_ms"].get<std::string>(), &fill_ms));
  EXPECT_DOUBLE_EQ(fill_ms, 7.25);
  EXPECT_EQ(bubbles[1]["args"]["fill_steps"], "1");
}

}  // namespace
}  // namespace pswitch::controller
