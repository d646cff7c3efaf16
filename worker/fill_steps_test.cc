#include "worker/fill_steps.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdio>
#include <future>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "gpu/host/compute_lock.h"
#include "gtest/gtest.h"
#include "models/training.h"
#include "worker/iterative_task.h"

namespace pswitch::worker {
namespace {

constexpr int64_t kMs = 1'000'000;

// A FillRun as pswitchd sends it: 1 ms steps, a 0.2 ms margin, ending at `end_ns`.
class FillRunMessage {
 public:
  explicit FillRunMessage(int64_t end_ns, bool resident = false, int64_t step_ns = kMs,
                          const std::string& device_lock = "") {
    const proto::Slice bell(7, 0, fill::kBellBytes);
    b_.Finish(proto::CreateFillRun(
        b_, end_ns, kMs / 5, step_ns, 0, proto::FillRunKind::Synthetic, kMs, 0, false,
        device_lock.empty() ? 0 : b_.CreateString(device_lock), 0, resident ? &bell : nullptr));
  }
  const proto::FillRun& get() const {
    return *flatbuffers::GetRoot<proto::FillRun>(b_.GetBufferPointer());
  }

 private:
  flatbuffers::FlatBufferBuilder b_;
};

// The page as pswitchd's BubbleBell writes it (controller/bubble_bell.cc).
void Open(fill::BellLayout& bell, int64_t end_ns) {
  bell.cut_at_ns.store(end_ns - kMs / 10);
  bell.bubble_end_ns.store(end_ns);
  bell.seq.fetch_add(1);
  fill::BellWakeAll(bell);
}

// A resident run's steps over a bell of its own, as the worker makes them.
struct ResidentSteps {
  explicit ResidentSteps(int64_t step_ns = kMs, const std::string& device_lock = "")
      : bell(std::make_unique<fill::BellLayout>()),
        run(0, /*resident=*/true, step_ns, device_lock) {
    auto created = FillSteps::Create(run.get(), &stop, absl::ZeroDuration(), bell.get());
    EXPECT_TRUE(created.ok()) << created.status();
    if (created.ok()) steps = *std::move(created);
  }
  std::unique_ptr<fill::BellLayout> bell;
  FillRunMessage run;
  std::atomic<bool> stop{false};
  std::unique_ptr<FillSteps> steps;
};

TEST(FillStepsTest, ARunOfOneBubbleAnswersAtOnceAndCutsAtItsOwnEnd) {
  const int64_t end = base::MonotonicNowNs() - kMs;  // already over
  FillRunMessage run(end);
  std::atomic<bool> stop{false};
  auto steps = FillSteps::Create(run.get(), &stop);
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_FALSE((*steps)->resident());
  EXPECT_FALSE((*steps)->MayStart());  // no wait: the run ends
  ASSERT_NE((*steps)->cut_at(), nullptr);
  EXPECT_EQ((*steps)->cut_at()->load(), end - kMs / 10);
}

// A resident run between bubbles waits on its bell: it starts a step only once pswitchd opens a
// bubble with room, and reads that bubble's cut.
TEST(FillStepsTest, AResidentRunWaitsForTheNextBubbleOnItsBell) {
  ResidentSteps r;
  ASSERT_NE(r.steps, nullptr);
  ASSERT_TRUE(r.steps->resident());
  EXPECT_EQ(r.steps->cut_at(), &r.bell->cut_at_ns);
  auto may = std::async(std::launch::async, [&] { return r.steps->MayStart(); });
  EXPECT_EQ(may.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout)
      << "it must wait for a bubble, not end";
  // A bubble too short for a 1 ms step and its margin wakes it, and it waits on.
  Open(*r.bell, base::MonotonicNowNs() + kMs / 2);
  EXPECT_EQ(may.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  const int64_t end = base::MonotonicNowNs() + 1000 * kMs;
  Open(*r.bell, end);
  ASSERT_EQ(may.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(may.get());
  EXPECT_EQ(r.steps->cut_at()->load(), end - kMs / 10);
}

TEST(FillStepsTest, AResidentRunWaitingBetweenBubblesEndsWhenItsBellIsStopped) {
  ResidentSteps r;
  ASSERT_NE(r.steps, nullptr);
  auto may = std::async(std::launch::async, [&] { return r.steps->MayStart(); });
  EXPECT_EQ(may.wait_for(std::chrono::milliseconds(30)), std::future_status::timeout);
  r.bell->stop.store(1);
  r.bell->seq.fetch_add(1);
  fill::BellWakeAll(*r.bell);
  ASSERT_EQ(may.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_FALSE(may.get());
  EXPECT_TRUE(r.steps->stopping());
}

TEST(FillStepsTest, AResidentRunWaitingBetweenBubblesEndsOnAStopMessageToo) {
  ResidentSteps r;
  ASSERT_NE(r.steps, nullptr);
  auto may = std::async(std::launch::async, [&] { return r.steps->MayStart(); });
  r.stop.store(true);  // no ring: the wait's poll finds it
  ASSERT_EQ(may.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_FALSE(may.get());
}

// What the run writes back is what pswitchd counts without a message: its steps, their time,
// the job's progress, and whether it is in a step.
TEST(FillStepsTest, AResidentRunWritesWhatItDidOnItsBell) {
  ResidentSteps r;
  ASSERT_NE(r.steps, nullptr);
  Open(*r.bell, base::MonotonicNowNs() + 1000 * kMs);
  bool was_stepping = false;
  for (uint32_t i = 7; i < 10; ++i) {
    ASSERT_TRUE(r.steps->MayStart());
    auto ran = r.steps->Run(i, [&] {
      was_stepping = r.bell->stepping.load() == 1;
      return absl::OkStatus();
    });
    ASSERT_TRUE(ran.ok() && *ran) << ran.status();
  }
  EXPECT_TRUE(was_stepping);
  EXPECT_EQ(r.bell->stepping.load(), 0u);
  EXPECT_EQ(r.bell->steps.load(), 3u);
  EXPECT_EQ(r.bell->iterations_done.load(), 10u);
  EXPECT_GE(r.bell->idle_since_ns.load(), r.bell->last_step_start_ns.load());
  EXPECT_EQ(r.bell->overruns.load(), 0u);
  // A step cut at the bubble's end (which comes while it runs) counts as an overrun, and is not a
  // step done.
  auto cut = r.steps->Run(10, [&] {
    r.bell->cut_at_ns.store(base::MonotonicNowNs());
    return StepCutError();
  });
  EXPECT_TRUE(IsStepCut(cut.status()));
  EXPECT_EQ(r.bell->overruns.load(), 1u);
  EXPECT_EQ(r.bell->steps.load(), 3u);
  EXPECT_EQ(r.bell->iterations_done.load(), 10u);
}

// RunSteps with a resident run: a step cut at its bubble's end runs again in the next bubble,
// and the run ends only when its steps are done.
TEST(FillStepsTest, AResidentRunRunsACutStepAgainInTheNextBubble) {
  ResidentSteps r;
  ASSERT_NE(r.steps, nullptr);
  class CutOnce final : public IterativeTask {
   public:
    explicit CutOnce(fill::BellLayout& bell) : bell_(bell) {}
    absl::Status Step(uint32_t i) override {
      ++calls;
      if (i == 1 && !cut) {
        cut = true;
        // Its bubble ends under it; the next one opens as pswitchd would, later.
        bell_.bubble_end_ns.store(base::MonotonicNowNs());
        reopen = std::async(std::launch::async, [this] {
          absl::SleepFor(absl::Milliseconds(20));
          Open(bell_, base::MonotonicNowNs() + 1000 * kMs);
        });
        return StepCutError();
      }
      return absl::OkStatus();
    }
    fill::BellLayout& bell_;
    bool cut = false;
    int calls = 0;
    std::future<void> reopen;
  } task(*r.bell);
  Open(*r.bell, base::MonotonicNowNs() + 1000 * kMs);
  StepProgress progress;
  ASSERT_TRUE(RunSteps(task, 0, 3, r.stop, r.steps.get(), &progress).ok());
  EXPECT_EQ(progress.steps_done, 3u);
  EXPECT_FALSE(progress.stopped_early);
  EXPECT_EQ(task.calls, 4);  // step 1 twice
  EXPECT_EQ(r.bell->iterations_done.load(), 3u);
}

// A resident training step suspended at its bubble's end (issue 30): it may start with room for a
// part of it; at the point past its cut it drains the device, leaves it to the main job (the
// compute lock is free meanwhile), shows the run paused on its bell, and goes on once the next
// bubble opens. Its time is its computing time, not its wait; it is no overrun. A stop while it
// waits ends the step.
TEST(FillStepsTest, ASuspendedStepWaitsForTheNextBubbleShowingItPaused) {
  const std::string lock_path = absl::StrCat(::testing::TempDir(), "/fill-steps-lock-", ::getpid());
  ResidentSteps r(20 * kMs, lock_path);
  ASSERT_NE(r.steps, nullptr);
  EXPECT_EQ(r.steps->suspend(), nullptr);  // not until SetSuspendable
  // 5 ms left: no room for a 20 ms step, room for an eighth of it.
  Open(*r.bell, base::MonotonicNowNs() + 5 * kMs);
  auto whole = std::async(std::launch::async, [&] { return r.steps->MayStart(); });
  EXPECT_EQ(whole.wait_for(std::chrono::milliseconds(30)), std::future_status::timeout);
  int drains = 0;
  r.steps->SetSuspendable([&] { ++drains; });
  ASSERT_NE(r.steps->suspend(), nullptr);
  Open(*r.bell, base::MonotonicNowNs() + 5 * kMs);  // wakes the waiting MayStart
  ASSERT_EQ(whole.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_TRUE(whole.get());
  // The device is free when another open of its lock takes it at once.
  const auto device_is_free = [&] {
    const int fd = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
    const bool free = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (fd >= 0) ::close(fd);  // and with it the lock
    return free;
  };
  constexpr absl::Duration kWait = absl::Milliseconds(300);
  std::future<void> next;
  bool paused = false, device_free = false;
  auto ran = r.steps->Run(0, [&]() -> absl::Status {
    // Its bubble ends under it; pswitchd opens the next one later.
    r.bell->cut_at_ns.store(base::MonotonicNowNs());
    r.bell->bubble_end_ns.store(base::MonotonicNowNs());
    next = std::async(std::launch::async, [&] {
      absl::SleepFor(kWait);
      paused = r.bell->stepping.load() == 0 && r.bell->parts.load() == 1;
      device_free = device_is_free();
      Open(*r.bell, base::MonotonicNowNs() + 1000 * kMs);
    });
    models::StepCutPoint(nullptr, &r.bell->cut_at_ns, r.steps->suspend());
    return absl::OkStatus();
  });
  next.wait();
  ASSERT_TRUE(ran.ok() && *ran) << ran.status();
  EXPECT_EQ(drains, 1);
  EXPECT_TRUE(paused);
  EXPECT_TRUE(device_free);
  EXPECT_EQ(r.bell->steps.load(), 1u);
  EXPECT_EQ(r.bell->overruns.load(), 0u);
  EXPECT_LT(r.steps->step_ns(), absl::ToInt64Nanoseconds(kWait));
  // Suspended again, then stopped while it waits: the step is cut, no overrun.
  auto stopped = r.steps->Run(1, [&]() -> absl::Status {
    r.bell->cut_at_ns.store(base::MonotonicNowNs());
    r.bell->bubble_end_ns.store(base::MonotonicNowNs());
    next = std::async(std::launch::async, [&] {
      absl::SleepFor(absl::Milliseconds(20));
      r.bell->stop.store(1);
      r.bell->seq.fetch_add(1);
      fill::BellWakeAll(*r.bell);
    });
    try {
      models::StepCutPoint(nullptr, &r.bell->cut_at_ns, r.steps->suspend());
    } catch (const models::StepCut&) {
      return StepCutError();
    }
    return absl::OkStatus();
  });
  next.wait();
  EXPECT_TRUE(IsStepCut(stopped.status())) << stopped.status();
  EXPECT_EQ(r.bell->overruns.load(), 0u);
  EXPECT_EQ(r.bell->steps.load(), 1u);
  std::remove(lock_path.c_str());
}

// A step that splits (dataset inference in a resident run, issue 30 item 2): it may start with
// room for one of its rows, runs the rows that fit, and its time is its parts' together.
TEST(FillStepsTest, ASplittableStepStartsWithRoomForARowAndRunsTheRowsThatFit) {
  ResidentSteps r(16 * kMs);  // 1 ms a row of 16
  ASSERT_NE(r.steps, nullptr);
  FillSteps& fill = *r.steps;
  EXPECT_EQ(fill.RowsThatFit(), 0) << "not splittable yet";
  fill.SetSplittable(16);
  // 5.5 ms left (and the 0.2 ms margin): a whole step does not fit, some rows do.
  Open(*r.bell, base::MonotonicNowNs() + 5 * kMs + kMs / 2 + kMs / 5);
  EXPECT_TRUE(fill.MayStart());
  const int64_t fit = fill.RowsThatFit();
  EXPECT_GE(fit, 1);
  EXPECT_LE(fit, 5);
  // The bubble is over: no row fits; a long one: the whole step does.
  r.bell->bubble_end_ns.store(base::MonotonicNowNs());
  EXPECT_EQ(fill.RowsThatFit(), 0);
  Open(*r.bell, base::MonotonicNowNs() + 1000 * kMs);
  EXPECT_EQ(fill.RowsThatFit(), 16);
  // A step done in two parts (the first ended for want of room) counts once, with both parts'
  // time, and the part that stopped for room is no overrun.
  auto first = fill.Run(0, [] {
    absl::SleepFor(absl::Milliseconds(2));
    return StepCutError();
  });
  EXPECT_TRUE(IsStepCut(first.status()));
  EXPECT_EQ(r.bell->steps.load(), 0u);
  auto second = fill.Run(0, [] {
    absl::SleepFor(absl::Milliseconds(2));
    return absl::OkStatus();
  });
  ASSERT_TRUE(second.ok() && *second) << second.status();
  EXPECT_EQ(r.bell->steps.load(), 1u);
  EXPECT_GE(r.bell->step_ns.load(), 4 * kMs);
  EXPECT_EQ(r.bell->overruns.load(), 0u);
}

// A step the worker would begin past its bubble's cut (descheduled after its room check, the
// bubble ending early) does not begin: it would be cut at once.
TEST(FillStepsTest, AResidentStepDoesNotBeginPastItsBubblesCut) {
  ResidentSteps r;
  ASSERT_NE(r.steps, nullptr);
  Open(*r.bell, base::MonotonicNowNs() + 1000 * kMs);
  ASSERT_TRUE(r.steps->MayStart());
  r.bell->cut_at_ns.store(base::MonotonicNowNs());  // the bubble ended under it
  bool ran = false;
  auto started = r.steps->Run(0, [&] {
    ran = true;
    return absl::OkStatus();
  });
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_FALSE(*started);
  EXPECT_FALSE(ran);
  EXPECT_EQ(r.bell->stepping.load(), 0u);
}

}  // namespace
}  // namespace pswitch::worker
