// bench-grouping: search time and plan quality of the grouping algorithms on ResNet-152-,
// Inception-v3- and BERT-base-shaped profiles (or real ones from profile-model), with the
// PipeSwitch paper's Algorithm 1 search times printed beside ours for reference.
//
// The generated profiles use the models' real layer sequences and fp32 parameter sizes
// (weights, biases and BatchNorm running statistics); execution times come from a simple
// GPU model (per-op launch cost + FLOPs at an effective rate + memory traffic) with a fixed
// seed, tuned so each model runs in roughly 10-30 ms, as on a V100 at small batch.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grouping/baselines.h"
#include "grouping/bnb.h"
#include "grouping/cost_model.h"
#include "grouping/dp.h"
#include "grouping/evaluator.h"
#include "grouping/profile.h"
#include "tools/cli.h"

ABSL_FLAG(std::vector<std::string>, profile, {},
          "comma-separated profile JSON files to bench instead of the generated models");
ABSL_FLAG(std::vector<std::string>, bandwidths, std::vector<std::string>({"12e9", "25e9"}),
          "link bandwidths (bytes/s) for the generated profiles");
ABSL_FLAG(int, repeat, 5, "runs per search; the median time is reported");
ABSL_FLAG(double, paper_rules_time_limit_s, 2.0,
          "time limit for bnb with the paper's two pruning rules only (no dominance memo)");
ABSL_FLAG(bool, stats, false, "print search statistics under each row");
ABSL_FLAG(std::string, write_profiles, "", "if set, write the generated profiles to this dir");

namespace pswitch::grouping {
namespace {

constexpr double kTransferOverheadS = 15e-6;
constexpr double kGroupSyncOverheadS = 10e-6;
constexpr double kLaunchS = 15e-6;          // per op, framework + kernel launch
constexpr double kMemoryBytesPerS = 450e9;  // effective device memory bandwidth

// Builds a profile layer by layer; exec times get a deterministic +-10% jitter.
class ProfileBuilder {
 public:
  ProfileBuilder(std::string model, double flops_per_s, uint64_t seed)
      : flops_per_s_(flops_per_s), rng_(seed) {
    profile_.model = std::move(model);
    profile_.transfer_overhead_s = kTransferOverheadS;
    profile_.group_sync_overhead_s = kGroupSyncOverheadS;
  }

  // A layer with `params` fp32 parameters, `flops` of compute and `traffic_bytes` of memory.
  void Add(const std::string& name, int64_t params, double flops, double traffic_bytes) {
    std::lognormal_distribution<double> jitter(0.0, 0.1);
    const double exec_s =
        (kLaunchS + flops / flops_per_s_ + traffic_bytes / kMemoryBytesPerS) * jitter(rng_);
    profile_.layers.push_back({name, params * 4, exec_s});
  }
  void Conv(const std::string& name, int k_h, int k_w, int c_in, int c_out, int out_hw) {
    const double params = 1.0 * k_h * k_w * c_in * c_out;
    Add(name, static_cast<int64_t>(params), 2.0 * params * out_hw * out_hw,
        4.0 * c_out * out_hw * out_hw);
  }
  // BatchNorm: weight, bias, running mean and var; reads and writes the activation.
  void BatchNorm(const std::string& name, int channels, int hw) {
    Add(name, 4LL * channels, 0.0, 8.0 * channels * hw * hw);
  }
  // A parameter-free elementwise op or pooling over channels x hw x hw.
  void Elementwise(const std::string& name, int channels, int hw) {
    Add(name, 0, 0.0, 8.0 * channels * hw * hw);
  }
  Profile Build() { return std::move(profile_); }

 private:
  Profile profile_;
  double flops_per_s_;
  std::mt19937_64 rng_;
};

// torchvision resnet152: 4 + 50 * 9 + 4 * 2 (downsample) + 2 = 464 layers, ~241 MB.
Profile ResNet152() {
  ProfileBuilder b("resnet152", 2.5e12, 152);
  b.Conv("conv1", 7, 7, 3, 64, 112);
  b.BatchNorm("bn1", 64, 112);
  b.Elementwise("relu", 64, 112);
  b.Elementwise("maxpool", 64, 56);
  const int blocks[4] = {3, 8, 36, 3}, widths[4] = {64, 128, 256, 512}, hws[4] = {56, 28, 14, 7};
  int in = 64, in_hw = 56;
  for (int s = 0; s < 4; ++s) {
    const int w = widths[s], out = 4 * w, hw = hws[s];
    for (int k = 0; k < blocks[s]; ++k) {
      const std::string p = absl::StrCat("layer", s + 1, ".", k, ".");
      b.Conv(p + "conv1", 1, 1, in, w, in_hw);
      b.BatchNorm(p + "bn1", w, in_hw);
      b.Elementwise(p + "relu1", w, in_hw);
      b.Conv(p + "conv2", 3, 3, w, w, hw);
      b.BatchNorm(p + "bn2", w, hw);
      b.Elementwise(p + "relu2", w, hw);
      b.Conv(p + "conv3", 1, 1, w, out, hw);
      b.BatchNorm(p + "bn3", out, hw);
      if (k == 0) {
        b.Conv(p + "downsample.0", 1, 1, in, out, hw);
        b.BatchNorm(p + "downsample.1", out, hw);
      }
      b.Elementwise(p + "add_relu", out, hw);
      in = out;
      in_hw = hw;
    }
  }
  b.Elementwise("avgpool", 2048, 7);
  b.Add("fc", 2048 * 1000 + 1000, 2.0 * 2048 * 1000, 4.0 * 2048 * 1000);
  return b.Build();
}

// torchvision inception_v3 (no aux head): 94 conv+bn pairs (ReLU fused) + fc = 189 layers.
Profile InceptionV3() {
  ProfileBuilder b("inception_v3", 2.0e12, 3);
  auto conv_bn = [&](const std::string& name, int kh, int kw, int cin, int cout, int hw) {
    b.Conv(name + ".conv", kh, kw, cin, cout, hw);
    b.BatchNorm(name + ".bn", cout, hw);
  };
  conv_bn("Conv2d_1a_3x3", 3, 3, 3, 32, 149);
  conv_bn("Conv2d_2a_3x3", 3, 3, 32, 32, 147);
  conv_bn("Conv2d_2b_3x3", 3, 3, 32, 64, 147);
  conv_bn("Conv2d_3b_1x1", 1, 1, 64, 80, 73);
  conv_bn("Conv2d_4a_3x3", 3, 3, 80, 192, 71);
  const int a_in[3] = {192, 256, 288}, a_pool[3] = {32, 64, 64};
  for (int m = 0; m < 3; ++m) {  // InceptionA at 35x35
    const std::string p = absl::StrCat("Mixed_5", std::string(1, static_cast<char>('b' + m)), ".");
    conv_bn(p + "branch1x1", 1, 1, a_in[m], 64, 35);
    conv_bn(p + "branch5x5_1", 1, 1, a_in[m], 48, 35);
    conv_bn(p + "branch5x5_2", 5, 5, 48, 64, 35);
    conv_bn(p + "branch3x3dbl_1", 1, 1, a_in[m], 64, 35);
    conv_bn(p + "branch3x3dbl_2", 3, 3, 64, 96, 35);
    conv_bn(p + "branch3x3dbl_3", 3, 3, 96, 96, 35);
    conv_bn(p + "branch_pool", 1, 1, a_in[m], a_pool[m], 35);
  }
  conv_bn("Mixed_6a.branch3x3", 3, 3, 288, 384, 17);  // InceptionB
  conv_bn("Mixed_6a.branch3x3dbl_1", 1, 1, 288, 64, 35);
  conv_bn("Mixed_6a.branch3x3dbl_2", 3, 3, 64, 96, 35);
  conv_bn("Mixed_6a.branch3x3dbl_3", 3, 3, 96, 96, 17);
  const int c7s[4] = {128, 160, 160, 192};
  for (int m = 0; m < 4; ++m) {  // InceptionC at 17x17
    const std::string p = absl::StrCat("Mixed_6", std::string(1, static_cast<char>('b' + m)), ".");
    const int c7 = c7s[m];
    conv_bn(p + "branch1x1", 1, 1, 768, 192, 17);
    conv_bn(p + "branch7x7_1", 1, 1, 768, c7, 17);
    conv_bn(p + "branch7x7_2", 1, 7, c7, c7, 17);
    conv_bn(p + "branch7x7_3", 7, 1, c7, 192, 17);
    conv_bn(p + "branch7x7dbl_1", 1, 1, 768, c7, 17);
    conv_bn(p + "branch7x7dbl_2", 7, 1, c7, c7, 17);
    conv_bn(p + "branch7x7dbl_3", 1, 7, c7, c7, 17);
    conv_bn(p + "branch7x7dbl_4", 7, 1, c7, c7, 17);
    conv_bn(p + "branch7x7dbl_5", 1, 7, c7, 192, 17);
    conv_bn(p + "branch_pool", 1, 1, 768, 192, 17);
  }
  conv_bn("Mixed_7a.branch3x3_1", 1, 1, 768, 192, 17);  // InceptionD
  conv_bn("Mixed_7a.branch3x3_2", 3, 3, 192, 320, 8);
  conv_bn("Mixed_7a.branch7x7x3_1", 1, 1, 768, 192, 17);
  conv_bn("Mixed_7a.branch7x7x3_2", 1, 7, 192, 192, 17);
  conv_bn("Mixed_7a.branch7x7x3_3", 7, 1, 192, 192, 17);
  conv_bn("Mixed_7a.branch7x7x3_4", 3, 3, 192, 192, 8);
  const int e_in[2] = {1280, 2048};
  for (int m = 0; m < 2; ++m) {  // InceptionE at 8x8
    const std::string p = absl::StrCat("Mixed_7", std::string(1, static_cast<char>('b' + m)), ".");
    conv_bn(p + "branch1x1", 1, 1, e_in[m], 320, 8);
    conv_bn(p + "branch3x3_1", 1, 1, e_in[m], 384, 8);
    conv_bn(p + "branch3x3_2a", 1, 3, 384, 384, 8);
    conv_bn(p + "branch3x3_2b", 3, 1, 384, 384, 8);
    conv_bn(p + "branch3x3dbl_1", 1, 1, e_in[m], 448, 8);
    conv_bn(p + "branch3x3dbl_2", 3, 3, 448, 384, 8);
    conv_bn(p + "branch3x3dbl_3a", 1, 3, 384, 384, 8);
    conv_bn(p + "branch3x3dbl_3b", 3, 1, 384, 384, 8);
    conv_bn(p + "branch_pool", 1, 1, e_in[m], 192, 8);
  }
  b.Add("fc", 2048 * 1000 + 1000, 2.0 * 2048 * 1000, 4.0 * 2048 * 1000);
  return b.Build();
}

// Hugging Face bert-base-uncased at sequence length 384: 5 embedding layers, 12 encoder
// layers of 11 ops, pooler dense + tanh = 139 layers, ~438 MB.
Profile BertBase() {
  ProfileBuilder b("bert_base", 5.0e12, 110);
  constexpr int kSeq = 384, kHidden = 768, kInter = 3072, kHeads = 12;
  const double act = 4.0 * kSeq * kHidden;
  auto dense = [&](const std::string& name, int in, int out) {
    b.Add(name, 1LL * in * out + out, 2.0 * kSeq * in * out, 4.0 * kSeq * (in + out));
  };
  b.Add("embeddings.word_embeddings", 30522LL * kHidden, 0, act);
  b.Add("embeddings.position_embeddings", 512LL * kHidden, 0, act);
  b.Add("embeddings.token_type_embeddings", 2LL * kHidden, 0, act);
  b.Add("embeddings.LayerNorm", 2LL * kHidden, 0, 2 * act);
  b.Add("embeddings.dropout", 0, 0, 2 * act);
  for (int l = 0; l < 12; ++l) {
    const std::string p = absl::StrCat("encoder.layer.", l, ".");
    dense(p + "attention.self.query", kHidden, kHidden);
    dense(p + "attention.self.key", kHidden, kHidden);
    dense(p + "attention.self.value", kHidden, kHidden);
    b.Add(p + "attention.self.scores_softmax", 0, 2.0 * kSeq * kSeq * kHidden,
          3 * 4.0 * kHeads * kSeq * kSeq);
    b.Add(p + "attention.self.context", 0, 2.0 * kSeq * kSeq * kHidden, act);
    dense(p + "attention.output.dense", kHidden, kHidden);
    b.Add(p + "attention.output.LayerNorm", 2LL * kHidden, 0, 3 * act);
    dense(p + "intermediate.dense", kHidden, kInter);
    b.Add(p + "intermediate.gelu", 0, 0, 8.0 * kSeq * kInter);
    dense(p + "output.dense", kInter, kHidden);
    b.Add(p + "output.LayerNorm", 2LL * kHidden, 0, 3 * act);
  }
  b.Add("pooler.dense", 1LL * kHidden * kHidden + kHidden, 2.0 * kHidden * kHidden, 0);
  b.Add("pooler.tanh", 0, 0, 8.0 * kHidden);
  return b.Build();
}

// PipeSwitch (OSDI'20) Table 5: Algorithm 1's search time, in seconds.
double PaperSearchS(const std::string& model) {
  if (model == "resnet152") return 1.33;
  if (model == "inception_v3") return 0.18;
  if (model == "bert_base") return 0.34;
  return -1;
}

template <typename Search>
double MedianSeconds(int repeat, Search&& search) {
  std::vector<double> seconds;
  for (int r = 0; r < std::max(1, repeat); ++r) {
    const auto start = std::chrono::steady_clock::now();
    search();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

double Ms(double seconds) { return seconds * 1e3; }

// Benches one profile and prints one table row; returns false when bnb and dp disagree.
bool BenchProfile(const Profile& profile) {
  absl::StatusOr<CostModel> model_or = CostModel::Create(profile);
  if (!model_or.ok()) {
    std::fprintf(stderr, "bench-grouping: %s\n", std::string(model_or.status().message()).c_str());
    return false;
  }
  const CostModel& model = *model_or;
  const int n = model.num_layers();
  const int repeat = absl::GetFlag(FLAGS_repeat);
  GroupingResult dp, bnb, paper;
  BnbStats bnb_stats, paper_stats;
  const double dp_s = MedianSeconds(repeat, [&] { dp = *FindOptimalGroupingDp(model); });
  const double bnb_s =
      MedianSeconds(repeat, [&] { bnb = *FindOptimalGroupingBnb(model, {}, &bnb_stats); });
  BnbOptions paper_rules;
  paper_rules.dominance_memo = false;
  paper_rules.time_limit = absl::Seconds(absl::GetFlag(FLAGS_paper_rules_time_limit_s));
  const double paper_s =
      MedianSeconds(1, [&] { paper = *FindOptimalGroupingBnb(model, paper_rules, &paper_stats); });
  const bool agree = std::fabs(bnb.total_s - dp.total_s) <= 1e-12 * dp.total_s;
  const bool paper_agree =
      paper.proven_optimal && std::fabs(paper.total_s - dp.total_s) <= 1e-12 * dp.total_s;

  int64_t bytes = 0;
  double exec_s = 0;
  for (const LayerProfile& layer : profile.layers) {
    bytes += layer.param_bytes;
    exec_s += layer.exec_s;
  }
  const std::string paper_cell =
      paper.proven_optimal
          ? absl::StrFormat("%9.2f", Ms(paper_s))
          : absl::StrFormat(">%7.0fs", absl::GetFlag(FLAGS_paper_rules_time_limit_s));
  const double paper_ref = PaperSearchS(profile.model);
  std::printf(
      "%-13s %4d %6.1f %5.1f %6.2f | %7.2f %7.2f %s %6.3fs | %7.3f %7.3f %7.3f %7.3f %4zu | %s%s\n",
      profile.model.c_str(), n, bytes / 1e6, model.bandwidth_bytes_per_s() / 1e9, Ms(exec_s),
      Ms(dp_s), Ms(bnb_s), paper_cell.c_str(), paper_ref, Ms(PlanTotalS(model, SingleGroupPlan(n))),
      Ms(PlanTotalS(model, PerLayerPlan(n))), Ms(PlanTotalS(model, *EveryKPlan(n, 10))),
      Ms(dp.total_s), dp.plan.size(), agree ? "yes" : "NO",
      paper.proven_optimal ? (paper_agree ? "/yes" : "/NO") : "/-");
  if (absl::GetFlag(FLAGS_stats)) {
    std::printf(
        "  bnb: %lld nodes, %lld bound-pruned, %lld j*-skipped, %lld memo-pruned, %lld "
        "improvements; bnb-paper: %lld nodes, %lld bound-pruned, %lld j*-skipped\n",
        static_cast<long long>(bnb_stats.nodes), static_cast<long long>(bnb_stats.bound_pruned),
        static_cast<long long>(bnb_stats.jstar_skipped),
        static_cast<long long>(bnb_stats.dominance_pruned),
        static_cast<long long>(bnb_stats.improvements), static_cast<long long>(paper_stats.nodes),
        static_cast<long long>(paper_stats.bound_pruned),
        static_cast<long long>(paper_stats.jstar_skipped));
  }
  std::fflush(stdout);
  return agree && (!paper.proven_optimal || paper_agree);
}

int Main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(
      argc, argv, "bench-grouping [--profile a.json,b.json] [--bandwidths 12e9,25e9] [--repeat N]");
  std::vector<Profile> profiles;
  for (const std::string& path : absl::GetFlag(FLAGS_profile)) {
    absl::StatusOr<Profile> profile = LoadProfileFile(path);
    if (!profile.ok()) {
      std::fprintf(stderr, "bench-grouping: %s\n", std::string(profile.status().message()).c_str());
      return 1;
    }
    profiles.push_back(*std::move(profile));
  }
  if (profiles.empty()) {
    for (const std::string& text : absl::GetFlag(FLAGS_bandwidths)) {
      double bandwidth = 0;
      if (!absl::SimpleAtod(text, &bandwidth) || !(bandwidth > 0)) {
        std::fprintf(stderr, "bench-grouping: bad bandwidth '%s'\n", text.c_str());
        return 2;
      }
      for (Profile profile : {ResNet152(), InceptionV3(), BertBase()}) {
        profile.bandwidth_bytes_per_s = bandwidth;
        profiles.push_back(std::move(profile));
      }
    }
  }
  const std::string dir = absl::GetFlag(FLAGS_write_profiles);
  if (!dir.empty()) {
    for (const Profile& profile : profiles) {
      const std::string path = absl::StrFormat("%s/%s_%.0fGBps.json", dir, profile.model,
                                               profile.bandwidth_bytes_per_s / 1e9);
      std::ofstream(path) << ProfileToJson(profile).dump(1) << "\n";
    }
  }
  std::printf(
      "transfer_overhead %.0f us, group_sync_overhead %.0f us (generated profiles); search "
      "times are medians of %d runs\n"
      "bnb: Algorithm 1 + corrected bound + j* + dominance memo; bnb-paper: the paper's two "
      "rules only (corrected bound, no memo); paper: Table 5\n\n",
      kTransferOverheadS * 1e6, kGroupSyncOverheadS * 1e6, absl::GetFlag(FLAGS_repeat));
  std::printf("%-13s %4s %6s %5s %6s | %7s %7s %9s %7s | %7s %7s %7s %7s %4s | %s\n", "model", "n",
              "MB", "GB/s", "exec", "dp ms", "bnb ms", "bnb-paper", "paper", "single", "layer",
              "every10", "optimal", "grps", "bnb=dp");
  bool ok = true;
  for (const Profile& profile : profiles) ok = BenchProfile(profile) && ok;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace pswitch::grouping

int main(int argc, char** argv) { return pswitch::grouping::Main(argc, argv); }
