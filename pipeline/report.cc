#include "pipeline/report.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace pswitch::pipeline {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

absl::Duration StageIterationStats::Waiting() const {
  absl::Duration total = tail;
  for (const MeasuredWait& w : waits) total += w.duration;
  return total;
}

ReportSummary Summarize(const PipelineReport& report) {
  ReportSummary summary;
  summary.stages.resize(report.stages);
  absl::Duration wall_sum, bubble_sum;
  for (const IterationStats& it : report.iterations) {
    if (it.warmup) continue;
    if (summary.iterations == 0 || it.wall < summary.wall_min) summary.wall_min = it.wall;
    summary.wall_max = std::max(summary.wall_max, it.wall);
    ++summary.iterations;
    wall_sum += it.wall;
    summary.final_loss = it.loss;
    for (const StageIterationStats& s : it.stages) {
      if (s.stage < 0 || s.stage >= report.stages) continue;
      StageSummary& out = summary.stages[s.stage];
      out.busy += s.Busy();
      out.bubble += s.Waiting();
      out.other += it.wall - s.Busy() - s.Waiting();
      out.peak_in_flight = std::max(out.peak_in_flight, s.peak_in_flight);
      bubble_sum += s.Waiting();
    }
  }
  if (summary.iterations == 0) return summary;
  summary.wall_mean = wall_sum / summary.iterations;
  for (StageSummary& s : summary.stages) {
    s.busy /= summary.iterations;
    s.bubble /= summary.iterations;
    s.other /= summary.iterations;
  }
  if (wall_sum > absl::ZeroDuration() && report.stages > 0) {
    summary.bubble_ratio = absl::FDivDuration(bubble_sum, wall_sum) / report.stages;
  }
  return summary;
}

std::string FormatSummary(const PipelineReport& report, const std::string& mode) {
  const ReportSummary sum = Summarize(report);
  const SimulatedIteration& p = report.predicted;
  std::string out = absl::StrFormat(
      "pipetrain: %s, %d stages x %d micro-batches, %s; %d measured iterations\n",
      ScheduleKindName(report.schedule), report.stages, report.microbatches, mode, sum.iterations);
  absl::StrAppendFormat(
      &out, "iteration time  measured %.2f ms (min %.2f, max %.2f)  predicted %.2f ms\n",
      Ms(sum.wall_mean), Ms(sum.wall_min), Ms(sum.wall_max), Ms(p.iteration));
  absl::StrAppendFormat(
      &out, "bubble ratio    measured %.3f  predicted %.3f  (uniform (S-1)/(M+S-1) = %.3f)\n",
      sum.bubble_ratio, p.bubble_ratio, UniformBubbleRatio(report.stages, report.microbatches));
  if (std::isfinite(sum.final_loss))
    absl::StrAppendFormat(&out, "loss            %.5f\n", sum.final_loss);
  absl::StrAppend(&out,
                  "stage  fwd_ms  bwd_ms |  busy_ms  bubble_ms  other_ms | predicted busy/bubble "
                  "| peak in-flight\n");
  for (int s = 0; s < report.stages; ++s) {
    const StageSummary& st = sum.stages[s];
    const StageCost cost =
        s < static_cast<int>(report.costs.size()) ? report.costs[s] : StageCost{};
    const StageTimeline* tl = s < static_cast<int>(p.stages.size()) ? &p.stages[s] : nullptr;
    absl::StrAppendFormat(&out, "%5d  %6.2f  %6.2f | %8.2f  %9.2f  %8.2f | %8.2f / %-8.2f | %d\n",
                          s, Ms(cost.forward), Ms(cost.backward), Ms(st.busy), Ms(st.bubble),
                          Ms(st.other), tl ? Ms(tl->busy) : 0.0, tl ? Ms(tl->idle_total) : 0.0,
                          st.peak_in_flight);
  }
  return out;
}

std::string ReportJson(const PipelineReport& report, const std::string& mode) {
  using nlohmann::json;
  const ReportSummary sum = Summarize(report);
  json costs = json::array(), predicted_stages = json::array();
  for (const StageCost& c : report.costs) {
    costs.push_back({{"forward_ms", Ms(c.forward)}, {"backward_ms", Ms(c.backward)}});
  }
  for (const StageTimeline& t : report.predicted.stages) {
    json idle = json::array();
    for (const IdleInterval& i : t.idle) {
      idle.push_back(
          {{"before_op", i.before_op}, {"start_ms", Ms(i.start)}, {"duration_ms", Ms(i.duration)}});
    }
    predicted_stages.push_back(
        {{"busy_ms", Ms(t.busy)}, {"bubble_ms", Ms(t.idle_total)}, {"bubbles", idle}});
  }
  json iterations = json::array();
  for (const IterationStats& it : report.iterations) {
    json stages = json::array();
    for (const StageIterationStats& s : it.stages) {
      json waits = json::array();
      for (const MeasuredWait& w : s.waits) {
        waits.push_back({{"before_op", w.before_op},
                         {"start_ms", Ms(w.start)},
                         {"duration_ms", Ms(w.duration)},
                         {"expected_ms", Ms(w.expected)}});
      }
      stages.push_back({{"stage", s.stage},
                        {"busy_ms", Ms(s.Busy())},
                        {"forward_ms", Ms(s.forward)},
                        {"backward_ms", Ms(s.backward)},
                        {"step_ms", Ms(s.step)},
                        {"bubble_ms", Ms(s.Waiting())},
                        {"tail_ms", Ms(s.tail)},
                        {"finish_ms", Ms(s.finish)},
                        {"peak_in_flight", s.peak_in_flight},
                        {"waits", waits}});
    }
    json entry = {{"iteration", it.iteration},
                  {"warmup", it.warmup},
                  {"wall_ms", Ms(it.wall)},
                  {"stages", stages}};
    if (std::isfinite(it.loss)) entry["loss"] = it.loss;
    iterations.push_back(entry);
  }
  json stage_summary = json::array();
  for (const StageSummary& s : sum.stages) {
    stage_summary.push_back({{"busy_ms", Ms(s.busy)},
                             {"bubble_ms", Ms(s.bubble)},
                             {"other_ms", Ms(s.other)},
                             {"peak_in_flight", s.peak_in_flight}});
  }
  json summary = {{"iterations", sum.iterations},         {"iteration_ms_mean", Ms(sum.wall_mean)},
                  {"iteration_ms_min", Ms(sum.wall_min)}, {"iteration_ms_max", Ms(sum.wall_max)},
                  {"bubble_ratio", sum.bubble_ratio},     {"stages", stage_summary}};
  if (std::isfinite(sum.final_loss) && sum.iterations > 0) summary["final_loss"] = sum.final_loss;
  json j = {{"schedule", std::string(ScheduleKindName(report.schedule))},
            {"stages", report.stages},
            {"microbatches", report.microbatches},
            {"mode", mode},
            {"costs", costs},
            {"predicted",
             {{"iteration_ms", Ms(report.predicted.iteration)},
              {"bubble_ratio", report.predicted.bubble_ratio},
              {"uniform_bubble_ratio", UniformBubbleRatio(report.stages, report.microbatches)},
              {"stages", predicted_stages}}},
            {"measured", summary},
            {"iterations", iterations}};
  return j.dump(2);
}

absl::Status WriteReportJson(const PipelineReport& report, const std::string& mode,
                             const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return absl::UnavailableError(absl::StrCat("cannot open '", path, "' for writing"));
  out << ReportJson(report, mode) << "\n";
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("writing '", path, "' failed"));
  return absl::OkStatus();
}

}  // namespace pswitch::pipeline
