#include "base/text.h"

#include <string>

#include "gtest/gtest.h"

namespace pswitch::base {
namespace {

TEST(TextTest, AcceptsWellFormedUtf8) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("resnet50"));
  EXPECT_TRUE(IsValidUtf8("modèle-日本-🚀"));
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));  // U+10FFFF
}

TEST(TextTest, RefusesIllFormedUtf8) {
  for (const std::string& bad : {std::string("\xff"), std::string("\xc0\xaf"),  // overlong '/'
                                 std::string("\xe0\x80\xaf"), std::string("\xed\xa0\x80"),  // surrogate
                                 std::string("\xf4\x90\x80\x80"),  // past U+10FFFF
                                 std::string("\x80"), std::string("a\xe2\x82"),  // truncated
                                 std::string("\xe2\x28\xa1")}) {
    EXPECT_FALSE(IsValidUtf8(bad)) << testing::PrintToString(bad);
  }
}

TEST(TextTest, CheckTextRefusesControlCharactersAndLengthWithoutEchoing) {
  EXPECT_TRUE(CheckText("model-1", "model name", 128).ok());
  absl::Status ctl = CheckText("evil\nlevel=error event=forged", "model name", 128);
  EXPECT_EQ(ctl.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(ctl.message()).find("forged"), std::string::npos);
  EXPECT_FALSE(CheckText("\xff\xfe", "model name", 128).ok());
  EXPECT_FALSE(CheckText(std::string(129, 'a'), "model name", 128).ok());
}

}  // namespace
}  // namespace pswitch::base
