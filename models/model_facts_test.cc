#include "models/model_facts.h"

#include <cstring>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pswitch::models {
namespace {

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

class ModelFactsTest : public ::testing::Test {
 protected:
  ModelFactsTest() {
    facts_.layers = {{"conv", true, {{"weight", Bytes(w_)}, {"bias", Bytes(b_)}}},
                     {"relu", true, {}},
                     {"aux.fc", false, {{"weight", Bytes(aux_)}}}};
    facts_.train_order = {0, 1, 2};  // the aux head runs when training
    facts_.optimizer_slot_bytes = 4096;
    facts_.trainable = absl::FailedPreconditionError("exported without a loss");
    facts_.input = {DType::kF32, {-1, 3, 32, 32}};
    facts_.output = {DType::kI64, {-1, 10}};
  }

  // The encoded facts with their metadata JSON changed by `edit`.
  std::string WithMeta(const std::function<void(nlohmann::json&)>& edit,
                       std::vector<SafetensorsEntry> extra = {}) {
    std::vector<SafetensorsEntry> entries = {
        {"0/0", DType::kU8, {16}, w_.data(), 16}, {"0/1", DType::kU8, {4}, b_.data(), 4},
        {"2/0", DType::kU8, {8}, aux_.data(), 8}};
    entries.insert(entries.end(), extra.begin(), extra.end());
    auto file = SafetensorsFile::Parse(*EncodeModelFacts(facts_), "facts");
    nlohmann::json meta = nlohmann::json::parse(file->metadata().at("pswitch.facts"));
    edit(meta);
    return *SerializeSafetensors(entries, {{"pswitch.facts", meta.dump()}});
  }

  void ExpectRefused(const std::string& bytes, absl::string_view why) {
    auto decoded = DecodeModelFacts(bytes, "the check of 'm'");
    ASSERT_FALSE(decoded.ok()) << why;
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument) << decoded.status();
    EXPECT_NE(decoded.status().message().find("the check of 'm'"), absl::string_view::npos);
  }

  std::string w_ = std::string(16, '\x11'), b_ = "bias", aux_ = std::string(8, '\x22');
  ModelFacts facts_;
};

TEST_F(ModelFactsTest, RoundTripKeepsLayersBytesAndEveryFact) {
  absl::StatusOr<std::string> encoded = EncodeModelFacts(facts_);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  absl::StatusOr<ModelFacts> decoded = DecodeModelFacts(*encoded, "facts");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->layers.size(), 3u);
  EXPECT_EQ(decoded->layers[0].name, "conv");
  ASSERT_EQ(decoded->layers[0].tensors.size(), 2u);
  EXPECT_EQ(decoded->layers[0].tensors[1].name, "bias");
  const auto& bias = decoded->layers[0].tensors[1].bytes;
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bias.data()), bias.size()), "bias");
  EXPECT_TRUE(decoded->layers[1].tensors.empty());
  EXPECT_FALSE(decoded->layers[2].executed);
  EXPECT_EQ(decoded->layers[2].tensors[0].bytes.size(), 8u);
  EXPECT_EQ(std::memcmp(decoded->layers[2].tensors[0].bytes.data(), aux_.data(), 8), 0);
  EXPECT_EQ(decoded->train_order, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(decoded->optimizer_slot_bytes, 4096u);
  EXPECT_EQ(decoded->trainable, facts_.trainable);
  EXPECT_EQ(decoded->input.dtype, DType::kF32);
  EXPECT_EQ(decoded->input.shape, (std::vector<int64_t>{-1, 3, 32, 32}));
  EXPECT_EQ(decoded->output.dtype, DType::kI64);
  EXPECT_TRUE(decoded->profile_json.empty());
  EXPECT_EQ(decoded->profile_us, 0u);
  // The result owns its bytes: the encoded string may go.
  encoded->assign(encoded->size(), '\0');
  EXPECT_EQ(decoded->layers[0].tensors[0].bytes[0], std::byte{0x11});
}

// An "auto" plan's profile, measured where the facts were made, travels with them; one over
// the bound is refused.
TEST_F(ModelFactsTest, AProfileTravelsWithTheFactsWithinItsBound) {
  facts_.profile_json = R"({"layers": []})";
  facts_.profile_us = 1234;
  absl::StatusOr<std::string> encoded = EncodeModelFacts(facts_);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  absl::StatusOr<ModelFacts> decoded = DecodeModelFacts(*encoded, "facts");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->profile_json, facts_.profile_json);
  EXPECT_EQ(decoded->profile_us, 1234u);
  ModelFactsLimits limits;
  limits.max_profile_bytes = 8;
  EXPECT_EQ(DecodeModelFacts(*encoded, "facts", limits).status().code(),
            absl::StatusCode::kInvalidArgument);
  ExpectRefused(WithMeta([](auto& m) { m["profile_us"] = -1; }), "negative profile time");
}

// A half-precision model's tensors are in its dtype (issue 28 item 5).
TEST_F(ModelFactsTest, HalfPrecisionSpecsRoundTrip) {
  facts_.input = {DType::kBF16, {-1, 3, 32, 32}};
  facts_.output = {DType::kF16, {-1, 10}};
  absl::StatusOr<ModelFacts> decoded = DecodeModelFacts(*EncodeModelFacts(facts_), "facts");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->input.dtype, DType::kBF16);
  EXPECT_EQ(decoded->output.dtype, DType::kF16);
}

TEST_F(ModelFactsTest, TheUnchangedMetadataDecodes) {
  EXPECT_TRUE(DecodeModelFacts(WithMeta([](nlohmann::json&) {}), "m").ok());
}

TEST_F(ModelFactsTest, MalformedOrInconsistentFactsAreRefused) {
  ExpectRefused("not a safetensors file", "garbage");
  ExpectRefused(*SerializeSafetensors({}), "no metadata");
  ExpectRefused(WithMeta([](auto& m) { m["format"] = 2; }), "format");
  ExpectRefused(WithMeta([](auto& m) { m["layers"][1]["name"] = "conv"; }), "repeated layer");
  ExpectRefused(WithMeta([](auto& m) { m["layers"][0]["name"] = ""; }), "empty name");
  ExpectRefused(WithMeta([](auto& m) { m["layers"][0]["name"] = std::string(2000, 'x'); }),
                "long name");
  ExpectRefused(WithMeta([](auto& m) { m["layers"][0]["tensors"][1] = "weight"; }),
                "repeated tensor");
  ExpectRefused(WithMeta([](auto& m) { m["layers"][1]["tensors"] = {"ghost"}; }),
                "a tensor without data");
  ExpectRefused(WithMeta([](auto& m) { m["layers"][2]["tensors"] = nlohmann::json::array(); }),
                "data no layer names");
  ExpectRefused(WithMeta([](auto& m) { m["layers"][0]["executed"] = 1; }), "executed type");
  ExpectRefused(WithMeta([](auto& m) { m["layers"] = {}; }), "layers not an array");
  ExpectRefused(WithMeta([](auto& m) { m["optimizer_slot_bytes"] = -1; }), "negative bytes");
  ExpectRefused(WithMeta([](auto& m) { m.erase("train_order"); }), "no train order");
  ExpectRefused(WithMeta([](auto& m) { m["train_order"] = {0, 3}; }), "a train layer past the end");
  ExpectRefused(WithMeta([](auto& m) { m["train_order"] = {1, 1}; }), "a train layer twice");
  ExpectRefused(WithMeta([](auto& m) { m["train_order"] = {0, -1}; }), "a negative index");
  ExpectRefused(WithMeta([](auto& m) { m["train_order"] = {0, 1, 2, 0}; }), "more than layers");
  ExpectRefused(WithMeta([](auto& m) { m["trainable"]["code"] = 99; }), "unknown code");
  ExpectRefused(WithMeta([](auto& m) { m["input"]["dtype"] = "F64"; }), "input dtype");
  ExpectRefused(WithMeta([](auto& m) { m["input"]["shape"][0] = 8; }), "no batch dimension");
  ExpectRefused(WithMeta([](auto& m) { m["output"]["shape"][1] = -3; }), "negative dimension");
  ExpectRefused(WithMeta([](auto& m) { m["output"].erase("shape"); }), "no shape");
  ExpectRefused(WithMeta([](auto& m) { m["output"]["shape"] = std::vector<int>(17, 1); }),
                "rank");
  // A tensor's data that is not U8.
  std::string f32(16, '\0');
  ExpectRefused(WithMeta([](auto& m) { m["layers"][1]["tensors"] = {"w"}; },
                         {{"1/0", DType::kF32, {4}, f32.data(), 16}}),
                "F32 data");
  ModelFactsLimits few;
  few.max_layers = 2;
  EXPECT_FALSE(DecodeModelFacts(*EncodeModelFacts(facts_), "m", few).ok());
}

TEST(RefusalTest, AChildsRefusalComesBackWithItsCodeAndABoundedMessage) {
  const absl::Status refused = absl::InvalidArgumentError("layer 'fc': parameter 'w' is float64");
  EXPECT_EQ(DecodeRefusal(EncodeRefusal(refused), "check"), refused);
  // Cut at a character boundary: "é" is two bytes.
  const absl::Status long_one = absl::InvalidArgumentError(std::string(9, 'a') + "\xc3\xa9" + "zz");
  const absl::Status cut = DecodeRefusal(EncodeRefusal(long_one), "check", 10);
  EXPECT_EQ(cut.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cut.message(), std::string(9, 'a') + "...");
  for (const char* bad : {"", "{}", "[1]", "{\"code\": 0, \"message\": \"ok\"}",
                          "{\"code\": 3}", "{\"code\": 77, \"message\": \"x\"}",
                          "{\"code\": 3, \"message\": 5}"}) {
    const absl::Status decoded = DecodeRefusal(bad, "check");
    EXPECT_EQ(decoded.code(), absl::StatusCode::kInternal) << bad;
    EXPECT_FALSE(decoded.ok());
  }
}

}  // namespace
}  // namespace pswitch::models
