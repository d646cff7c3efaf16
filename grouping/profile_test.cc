#include "grouping/profile.h"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::grouping {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kValid[] = R"({
  "model": "tiny",
  "bandwidth_bytes_per_s": 12e9,
  "transfer_overhead_s": 1.5e-5,
  "group_sync_overhead_s": 1e-5,
  "layers": [
    {"name": "conv1", "param_bytes": 37632, "exec_s": 0.0002},
    {"name": "relu", "param_bytes": 0, "exec_s": 0.00001},
    {"name": "fc", "param_bytes": 1e6, "exec_s": 0}
  ]
})";

// kValid with `from` replaced by `to` (which must occur once).
std::string Edit(const std::string& from, const std::string& to) {
  std::string text = kValid;
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  return text;
}

// The error message of parsing `text`, which must fail with InvalidArgument.
std::string ErrorOf(const std::string& text) {
  absl::StatusOr<Profile> profile = ParseProfileJson(text);
  EXPECT_FALSE(profile.ok());
  EXPECT_EQ(profile.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(profile.status().message());
}

TEST(ProfileTest, ParsesAValidProfile) {
  absl::StatusOr<Profile> profile = ParseProfileJson(kValid);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->model, "tiny");
  EXPECT_EQ(profile->bandwidth_bytes_per_s, 12e9);
  EXPECT_EQ(profile->transfer_overhead_s, 1.5e-5);
  EXPECT_EQ(profile->group_sync_overhead_s, 1e-5);
  ASSERT_EQ(profile->layers.size(), 3u);
  EXPECT_EQ(profile->layers[0].name, "conv1");
  EXPECT_EQ(profile->layers[0].param_bytes, 37632);
  EXPECT_EQ(profile->layers[2].param_bytes, 1000000);  // integral float accepted
  EXPECT_EQ(profile->layers[1].exec_s, 0.00001);
}

TEST(ProfileTest, RoundTripsThroughJson) {
  const Profile profile = *ParseProfileJson(kValid);
  absl::StatusOr<Profile> again = ParseProfileJson(ProfileToJson(profile).dump());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ProfileToJson(*again), ProfileToJson(profile));
}

TEST(ProfileTest, RejectsMissingFieldsNamingThem) {
  EXPECT_THAT(ErrorOf(Edit(R"("model": "tiny",)", "")), HasSubstr("missing field 'model'"));
  EXPECT_THAT(ErrorOf(Edit(R"("bandwidth_bytes_per_s": 12e9,)", "")),
              AllOf(HasSubstr("'tiny'"), HasSubstr("missing field 'bandwidth_bytes_per_s'")));
  EXPECT_THAT(ErrorOf(Edit(R"("transfer_overhead_s": 1.5e-5,)", "")),
              HasSubstr("missing field 'transfer_overhead_s'"));
  EXPECT_THAT(ErrorOf(Edit(R"("group_sync_overhead_s": 1e-5,)", "")),
              HasSubstr("missing field 'group_sync_overhead_s'"));
  EXPECT_THAT(ErrorOf(R"({"model": "m", "bandwidth_bytes_per_s": 1, "transfer_overhead_s": 0,
                          "group_sync_overhead_s": 0})"),
              HasSubstr("missing field 'layers'"));
  EXPECT_THAT(ErrorOf(Edit(R"("name": "relu", )", "")),
              AllOf(HasSubstr("layers[1]"), HasSubstr("missing field 'name'")));
  EXPECT_THAT(ErrorOf(Edit(R"("param_bytes": 0, )", "")),
              AllOf(HasSubstr("layers[1] 'relu'"), HasSubstr("missing field 'param_bytes'")));
  EXPECT_THAT(ErrorOf(Edit(R"(, "exec_s": 0.0002)", "")),
              AllOf(HasSubstr("layers[0] 'conv1'"), HasSubstr("missing field 'exec_s'")));
}

TEST(ProfileTest, RejectsNegativeNumbersNamingFieldAndIndex) {
  EXPECT_THAT(ErrorOf(Edit("1.5e-5", "-1")), HasSubstr("transfer_overhead_s must be finite"));
  EXPECT_THAT(ErrorOf(Edit(R"("group_sync_overhead_s": 1e-5)", R"("group_sync_overhead_s": -1)")),
              HasSubstr("group_sync_overhead_s"));
  EXPECT_THAT(ErrorOf(Edit(R"("param_bytes": 0,)", R"("param_bytes": -5,)")),
              AllOf(HasSubstr("layers[1] 'relu'"), HasSubstr("param_bytes")));
  EXPECT_THAT(ErrorOf(Edit("0.0002", "-0.0002")),
              AllOf(HasSubstr("layers[0] 'conv1'"), HasSubstr("exec_s must be finite and >= 0")));
}

TEST(ProfileTest, RejectsNonFiniteNumbers) {
  // JSON has no NaN or Infinity literals; an overflowing literal parses to infinity.
  // The parser rejects it; the message still names the field and index.
  EXPECT_THAT(ErrorOf(Edit("0.00001", "1e999")),
              AllOf(HasSubstr("layers[1].exec_s"), HasSubstr("overflow")));
  EXPECT_THAT(ErrorOf(Edit("12e9", "-1e999")), HasSubstr("at bandwidth_bytes_per_s"));
  EXPECT_THAT(ErrorOf(Edit("12e9", "NaN")), HasSubstr("invalid JSON at bandwidth_bytes_per_s"));
  // Programmatic profiles can hold NaN and infinity; ValidateProfile names them.
  Profile profile = *ParseProfileJson(kValid);
  profile.layers[2].exec_s = std::nan("");
  EXPECT_THAT(std::string(ValidateProfile(profile).message()),
              AllOf(HasSubstr("layers[2] 'fc'"), HasSubstr("exec_s")));
  profile = *ParseProfileJson(kValid);
  profile.group_sync_overhead_s = std::numeric_limits<double>::infinity();
  EXPECT_THAT(std::string(ValidateProfile(profile).message()), HasSubstr("group_sync_overhead_s"));
}

TEST(ProfileTest, RejectsZeroBandwidth) {
  EXPECT_THAT(ErrorOf(Edit("12e9", "0")),
              HasSubstr("bandwidth_bytes_per_s must be finite and > 0"));
}

TEST(ProfileTest, RejectsEmptyLayers) {
  EXPECT_THAT(ErrorOf(R"({"model": "m", "bandwidth_bytes_per_s": 1, "transfer_overhead_s": 0,
                          "group_sync_overhead_s": 0, "layers": []})"),
              HasSubstr("'layers' is empty"));
}

TEST(ProfileTest, RejectsMoreThan100000Layers) {
  std::string text =
      R"({"model": "big", "bandwidth_bytes_per_s": 1, "transfer_overhead_s": 0,
          "group_sync_overhead_s": 0, "layers": [)";
  for (int k = 0; k <= kMaxProfileLayers; ++k) {
    text += k == 0 ? "" : ",";
    text += R"({"name":"l","param_bytes":1,"exec_s":0})";
  }
  text += "]}";
  EXPECT_THAT(ErrorOf(text), AllOf(HasSubstr("100001 entries"), HasSubstr("100000")));
  Profile profile{"big", 1.0, 0.0, 0.0, {}};
  profile.layers.assign(kMaxProfileLayers, {"l", 1, 0.0});
  EXPECT_TRUE(ValidateProfile(profile).ok());
}

TEST(ProfileTest, RejectsWrongTypesAndBadJson) {
  EXPECT_THAT(ErrorOf(Edit(R"("tiny")", "7")), HasSubstr("'model' must be a string"));
  EXPECT_THAT(ErrorOf(Edit("12e9", R"("fast")")),
              HasSubstr("'bandwidth_bytes_per_s' must be a number"));
  EXPECT_THAT(ErrorOf(Edit("37632", "1.5")),
              AllOf(HasSubstr("layers[0] 'conv1'"), HasSubstr("non-negative integer")));
  EXPECT_THAT(ErrorOf(Edit(R"("layers": [)", R"("layers": [3, )")),
              AllOf(HasSubstr("layers[0]"), HasSubstr("must be an object")));
  EXPECT_THAT(ErrorOf("{\"model\": "), HasSubstr("invalid JSON"));
  EXPECT_THAT(ErrorOf("[1, 2]"), HasSubstr("must be a JSON object"));
}

TEST(ProfileTest, LoadProfileFileNamesThePath) {
  absl::StatusOr<Profile> missing = LoadProfileFile("/nonexistent/dir/p.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("/nonexistent/dir/p.json"));

  const std::string path =
      ::testing::TempDir() + "/profile_test_valid_" + std::to_string(getpid()) + ".json";
  std::ofstream(path) << kValid;
  absl::StatusOr<Profile> loaded = LoadProfileFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->layers.size(), 3u);

  std::ofstream(path) << Edit("12e9", "0");
  absl::StatusOr<Profile> bad = LoadProfileFile(path);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              AllOf(HasSubstr(path), HasSubstr("bandwidth_bytes_per_s")));
}

}  // namespace
}  // namespace pswitch::grouping
