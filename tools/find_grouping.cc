// find-grouping: computes a layer grouping plan for pipelined model transmission, offline,
// from a per-layer profile (the JSON that profile-model writes).
//
//   find-grouping --profile P.json [--algorithm dp|bnb|single|per-layer|every-k] [--k N]
//                 [--time-limit S] [--out plan.json]
//
// Writes {"model", "algorithm", "total_s", "search_s", "groups": [[first, last], ...]} (plus
// "proven_optimal" for bnb) to --out or stdout. Exit status 0 on success, 1 on bad input,
// 2 on bad usage.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grouping/cost_model.h"
#include "grouping/profile.h"
#include "grouping/search.h"
#include "base/status.h"

namespace pswitch {
namespace {

constexpr char kUsage[] =
    "usage: find-grouping --profile P.json [--algorithm dp|bnb|single|per-layer|every-k]\n"
    "                     [--k N] [--time-limit S] [--out plan.json]\n"
    "  --profile     per-layer profile JSON (required)\n"
    "  --algorithm   dp (default; exact, polynomial), bnb (PipeSwitch Algorithm 1, exact),\n"
    "                single, per-layer, every-k\n"
    "  --k           group size for every-k (default 10, must be > 0)\n"
    "  --time-limit  seconds; bnb returns its best plan so far when it runs out\n"
    "                (\"proven_optimal\": false). Other algorithms ignore it.\n"
    "  --out         write the plan here instead of stdout\n";

struct Flags {
  std::string profile_path;
  std::string algorithm = "dp";
  std::string k = "10";
  std::optional<std::string> time_limit;
  std::optional<std::string> out_path;
};

// Accepts --name=value and --name value. InvalidArgument for unknown flags, positional
// arguments, repeated or valueless flags.
absl::StatusOr<Flags> ParseFlags(int argc, char** argv, bool* help) {
  Flags flags;
  std::vector<std::string> seen;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return flags;
    }
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
    }
    for (const std::string& s : seen) {
      if (s == name) return absl::InvalidArgumentError(absl::StrCat("flag --", name, " repeated"));
    }
    seen.push_back(name);
    if (name == "profile") {
      flags.profile_path = value;
    } else if (name == "algorithm") {
      flags.algorithm = value;
    } else if (name == "k") {
      flags.k = value;
    } else if (name == "time-limit") {
      flags.time_limit = value;
    } else if (name == "out") {
      flags.out_path = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
  }
  if (flags.profile_path.empty()) return absl::InvalidArgumentError("--profile is required");
  return flags;
}

absl::StatusOr<grouping::SearchOptions> ParseSearchOptions(const Flags& flags) {
  grouping::SearchOptions options;
  PSWITCH_ASSIGN_OR_RETURN(options.algorithm, grouping::ParseGroupingAlgorithm(flags.algorithm));
  if (!absl::SimpleAtoi(flags.k, &options.k) || options.k <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--k must be a positive integer, got '", flags.k, "'"));
  }
  if (flags.time_limit.has_value()) {
    double seconds = 0;
    if (!absl::SimpleAtod(*flags.time_limit, &seconds) || !std::isfinite(seconds) || seconds < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--time-limit must be a finite number of seconds >= 0, got '", *flags.time_limit, "'"));
    }
    options.time_limit = absl::Seconds(seconds);
  }
  return options;
}

absl::Status Run(const Flags& flags) {
  PSWITCH_ASSIGN_OR_RETURN(const grouping::SearchOptions options, ParseSearchOptions(flags));
  PSWITCH_ASSIGN_OR_RETURN(const grouping::Profile profile,
                           grouping::LoadProfileFile(flags.profile_path));
  PSWITCH_ASSIGN_OR_RETURN(const grouping::CostModel model, grouping::CostModel::Create(profile));
  PSWITCH_ASSIGN_OR_RETURN(const grouping::SearchOutcome outcome,
                           grouping::FindGrouping(model, options));
  if (options.algorithm == grouping::GroupingAlgorithm::kBnb && !outcome.result.proven_optimal) {
    std::cerr << "find-grouping: bnb hit the time limit; the plan is the best found so far and "
                 "is not proven optimal\n";
  }
  const std::string text = grouping::SearchOutcomeToJson(model, options, outcome).dump() + "\n";
  if (!flags.out_path.has_value()) {
    std::cout << text << std::flush;
    if (!std::cout) return absl::UnknownError("cannot write to stdout");
    return absl::OkStatus();
  }
  std::ofstream out(*flags.out_path, std::ios::binary | std::ios::trunc);
  if (!out) return ErrnoStatus(absl::StrCat("cannot open '", *flags.out_path, "'"));
  out << text;
  out.close();
  if (!out) return ErrnoStatus(absl::StrCat("cannot write '", *flags.out_path, "'"));
  return absl::OkStatus();
}

}  // namespace
}  // namespace pswitch

int main(int argc, char** argv) {
  bool help = false;
  absl::StatusOr<pswitch::Flags> flags = pswitch::ParseFlags(argc, argv, &help);
  if (help) {
    std::cout << pswitch::kUsage;
    return 0;
  }
  if (!flags.ok()) {
    std::cerr << "find-grouping: " << flags.status().message() << "\n" << pswitch::kUsage;
    return 2;
  }
  absl::Status status = pswitch::Run(*flags);
  if (!status.ok()) {
    std::cerr << "find-grouping: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
