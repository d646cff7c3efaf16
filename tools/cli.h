// Command-line parsing shared by every pswitch binary.
#ifndef PSWITCH_TOOLS_CLI_H_
#define PSWITCH_TOOLS_CLI_H_

#include <string>
#include <vector>

namespace pswitch::tools {

// Parses absl flags after accepting the dashed spelling users expect (`--arena-bytes` for the
// flag `arena_bytes`), prints `usage` for --help, and exits with status 2 on an unknown flag or
// a bad value, or on positional arguments when `allow_positional` is false. Returns the
// positional arguments (program name excluded).
std::vector<std::string> ParseToolFlags(int argc, char** argv, const char* usage,
                                        bool allow_positional = false);

// The path of `name` in the directory of the running binary (build/bin/ holds them all).
std::string SiblingBinary(const std::string& name);

// The client token to present to pswitchd: `flag_value` when given, else $PSWITCH_TOKEN (so it
// need not appear in a process list), else empty.
std::string ClientToken(const std::string& flag_value);

// Dashes in a flag's name (not its value) become underscores: "--a-b=c-d" -> "--a_b=c-d".
std::string NormalizeFlagName(const std::string& arg);

}  // namespace pswitch::tools

#endif  // PSWITCH_TOOLS_CLI_H_
