// bench-lease-clear: what clearing the activation lease between owners costs on the host
// (issue 27: blocks are zeroed before they pass to another model's or principal's task).
//
// A "task" takes N blocks totalling --task-mib and frees them. The baseline is the next task of
// the same owner (nothing to clear); the figure is the next task of another owner (every byte
// the previous task touched is zeroed as its blocks are handed out again). Printed side by side,
// with memset's own throughput on this machine. On CUDA the same bytes are cleared with
// cudaMemsetAsync on the compute stream (device bandwidth, not measured here).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/flags/flag.h"
#include "tools/cli.h"
#include "worker/lease_blocks.h"

ABSL_FLAG(int, task_mib, 64, "bytes a task takes from the lease, MiB");
ABSL_FLAG(int, blocks, 64, "blocks per task");
ABSL_FLAG(int, rounds, 20, "tasks measured per case (the median is printed)");

namespace {

using Clock = std::chrono::steady_clock;
using pswitch::worker::LeaseBlocks;

// One task over `blocks`: takes every block (clearing what it must), touches it, frees it.
// Returns the milliseconds spent taking and clearing.
double Task(LeaseBlocks& blocks, uint64_t bytes, int count) {
  std::vector<std::byte*> taken;
  std::vector<LeaseBlocks::Range> clear;
  const auto start = Clock::now();
  for (int i = 0; i < count; ++i) {
    clear.clear();
    std::byte* p = blocks.Take(bytes / count, 0, &clear);
    for (const LeaseBlocks::Range& r : clear) std::memset(r.start, 0, r.bytes);
    taken.push_back(p);
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  for (std::byte* p : taken) {
    std::memset(p, 0x5a, bytes / count);  // the task writes its activations
    blocks.Give(p);
  }
  return ms;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(argc, argv,
                                 "what clearing the activation lease between owners costs.");
  const uint64_t bytes = uint64_t(absl::GetFlag(FLAGS_task_mib)) << 20;
  const int count = std::max(1, absl::GetFlag(FLAGS_blocks));
  std::vector<std::byte> lease(2 * bytes + (1 << 20));
  std::memset(lease.data(), 1, lease.size());  // resident
  LeaseBlocks blocks(lease.data(), lease.size(), 64);
  std::vector<double> same, other, memset_ms;
  (void)Task(blocks, bytes, count);
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    same.push_back(Task(blocks, bytes, count));
    blocks.NewOwner();
    other.push_back(Task(blocks, bytes, count));
    const auto start = Clock::now();
    std::memset(lease.data(), 0, bytes);
    memset_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  std::printf(
      "task of %d MiB in %d blocks: same owner (baseline) %.3f ms, another owner %.3f ms "
      "(+%.3f ms); memset of %d MiB alone %.3f ms (%.1f GB/s)\n",
      absl::GetFlag(FLAGS_task_mib), count, Median(same), Median(other),
      Median(other) - Median(same), absl::GetFlag(FLAGS_task_mib), Median(memset_ms),
      bytes / Median(memset_ms) / 1e6);
  return 0;
}
