#include "frontend/http_target.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"

namespace pswitch::frontend {
namespace {

int HexValue(char h) {
  return absl::ascii_isdigit(h) ? h - '0' : absl::ascii_tolower(h) - 'a' + 10;
}

std::string DecodeQueryPart(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '+') {
      out.push_back(' ');
    } else if (c == '%' && i + 2 < text.size() && absl::ascii_isxdigit(text[i + 1]) &&
               absl::ascii_isxdigit(text[i + 2])) {
      out.push_back(static_cast<char>(HexValue(text[i + 1]) * 16 + HexValue(text[i + 2])));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

void SplitTarget(absl::string_view target, std::string* path,
                 std::map<std::string, std::string>* query) {
  const size_t question = target.find('?');
  *path = std::string(target.substr(0, question));
  if (question == absl::string_view::npos) return;
  for (absl::string_view pair :
       absl::StrSplit(target.substr(question + 1), '&', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(pair, absl::MaxSplits('=', 1));
    (*query)[DecodeQueryPart(kv.first)] = DecodeQueryPart(kv.second);
  }
}

}  // namespace pswitch::frontend
