#include "controller/bubble_bell.h"

#include <sys/mman.h>

#include <new>

#include "base/status.h"

namespace pswitch::controller {

absl::StatusOr<std::shared_ptr<BubbleBell>> BubbleBell::Create() {
  PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<const dataplane::TransferRegion> region,
                           dataplane::TransferRegion::NewStaging(fill::kBellBytes, "pswitchd"));
  void* p = ::mmap(nullptr, fill::kBellBytes, PROT_READ | PROT_WRITE, MAP_SHARED, region->fd(), 0);
  if (p == MAP_FAILED) return ErrnoStatus("mapping a fill run's bell");
  // A new memfd reads as zeros: every field starts at 0 (closed, not stopped).
  auto* page = new (p) fill::BellLayout{};
  return std::shared_ptr<BubbleBell>(new BubbleBell(std::move(region), page));
}

BubbleBell::~BubbleBell() { ::munmap(page_, fill::kBellBytes); }

void BubbleBell::Open(int64_t end_ns, int64_t cut_at_ns) {
  // Counted before the page says it: a step begun in this bubble is never judged by the count of
  // the last. The cut before the end, so no reader pairs the new end with the old cut.
  opens_.fetch_add(1);
  page_->cut_at_ns.store(cut_at_ns);
  page_->bubble_end_ns.store(end_ns);
  page_->seq.fetch_add(1);
  fill::BellWakeAll(*page_);
}

void BubbleBell::Close(int64_t now_ns) {
  if (page_->bubble_end_ns.load() > now_ns) page_->bubble_end_ns.store(now_ns);
  if (page_->cut_at_ns.load() > now_ns) page_->cut_at_ns.store(now_ns);
  page_->seq.fetch_add(1);
  fill::BellWakeAll(*page_);
}

void BubbleBell::Stop() {
  stopped_.store(true);
  page_->stop.store(1);
  page_->seq.fetch_add(1);
  fill::BellWakeAll(*page_);
}

BubbleBell::Report BubbleBell::Read() const {
  Report r;
  r.stepping = page_->stepping.load() != 0;
  r.last_step_start_ns = page_->last_step_start_ns.load();
  r.idle_since_ns = page_->idle_since_ns.load();
  r.steps = page_->steps.load();
  r.step_ns = page_->step_ns.load();
  r.iterations_done = page_->iterations_done.load();
  r.overruns = page_->overruns.load();
  r.overrun_ns = page_->overrun_ns.load();
  r.late_starts = page_->late_starts.load();
  r.parts = page_->parts.load();
  return r;
}

}  // namespace pswitch::controller
