#include "tools/cli.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace pswitch::tools {

std::string NormalizeFlagName(const std::string& arg) {
  if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) return arg;
  std::string out = arg;
  size_t name_end = out.find('=');
  if (name_end == std::string::npos) name_end = out.size();
  for (size_t i = 2; i < name_end; ++i) {
    if (out[i] == '-') out[i] = '_';
  }
  return out;
}

std::vector<std::string> ParseToolFlags(int argc, char** argv, const char* usage,
                                        bool allow_positional) {
  absl::SetProgramUsageMessage(usage);
  // --help lists the flags of every tools/ source the binary links (each tool's flags live in
  // its own file). Abseil's default matches the file to the program's name, which a hyphenated
  // binary (bench-bubbles, from bench_bubbles.cc) never does: it printed "No flags matched".
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "tools/");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  std::vector<std::string> normalized;
  normalized.reserve(argc);
  bool after_separator = false;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") after_separator = true;
    normalized.push_back(i == 0 || after_separator ? arg : NormalizeFlagName(arg));
  }
  std::vector<char*> args;
  for (std::string& s : normalized) args.push_back(s.data());
  std::vector<char*> rest = absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  std::vector<std::string> positional(rest.begin() + 1, rest.end());
  if (!allow_positional && !positional.empty()) {
    std::fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", argv[0],
                 positional.front().c_str());
    std::exit(2);
  }
  return positional;
}

std::string SiblingBinary(const std::string& name) {
  std::error_code ec;
  return (std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / name).string();
}

std::string ClientToken(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  const char* env = std::getenv("PSWITCH_TOKEN");
  return env != nullptr ? std::string(env) : std::string();
}

}  // namespace pswitch::tools
