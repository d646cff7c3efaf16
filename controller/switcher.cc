#include "controller/switcher.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "controller/worker_commands.h"
#include "memdaemon/arena_layout.h"

namespace pswitch::controller {

using registry::CatalogEntry;

Switcher::Switcher(SwitcherOptions options, memdaemon::Transmitter* transmitter, WorkerPool* pool,
                   std::shared_ptr<EventLoop> loop,
                   CopyEnded on_copy_ended)
    : options_(options),
      transmitter_(transmitter),
      pool_(pool),
      loop_(std::move(loop)),
      on_copy_ended_(std::move(on_copy_ended)) {}

base::Log Switcher::Event(base::LogLevel level, absl::string_view event) const {
  base::Log line(level, event);
  line.Field("gpu", options_.gpu);
  return line;
}

std::optional<uint32_t> Switcher::Stop(int slot) {
  std::optional<uint32_t> value = pool_->SendStop(slot);
  if (value) last_stop_sent_ns_ = base::MonotonicNowNs();
  return value;
}

absl::StatusOr<Switcher::Placement> Switcher::Place(uint64_t task, const CatalogEntry& entry,
                                                    SwitchTimeline& timeline) {
  const std::string& model = entry.request.name;
  Placement placement;
  const int active = residency_.active_slot();
  if (residency_.Holds(model)) {
    placement.slot = active;
  } else {
    if (entry.plan.size() > memdaemon::kReadyFlagCount) {
      return absl::ResourceExhaustedError(
          absl::StrCat("model '", model, "' has ", entry.plan.size(), " groups; this GPU has ",
                       memdaemon::kReadyFlagCount, " ready flags"));
    }
    // A standby (not the active worker) takes the new model: the active one drains meanwhile.
    placement.slot = pool_->UsableOther(model, active);
    if (placement.slot < 0) placement.slot = active;
    memdaemon::TransmitRequest request;
    request.model = entry.stored;
    request.groups = entry.plan;
    request.weights_offset = options_.region_offset;
    request.flag_base = 0;
    int drain_slot = -1;
    // An idle old tenant has nothing in flight (its RunDone came after its stream synchronised):
    // no Stop, no device-side drain wait, no round trip on the switch.
    if (active >= 0 && !pool_->Idle(active)) {
      if (std::optional<uint32_t> value = Stop(active)) {
        request.drain =
            memdaemon::DrainCondition{static_cast<uint32_t>(active), *value, options_.drain_timeout};
        drain_slot = active;
        timeline.stop_sent_ns = last_stop_sent_ns_;
      }
    }
    // The copy engine reports the end; the handler runs on the loop after this one, by when
    // in_flight_ holds the transmission.
    const uint64_t id = next_id_++;
    request.on_finished = [this, id, loop = loop_] { loop->Post([this, id] { Ended(id); }); };
    request.on_stalled = [this, id, loop = loop_](const absl::Status& why) {
      loop->Post([this, id, why] { Stalled(id, why); });
    };
    PSWITCH_ASSIGN_OR_RETURN(placement.transmission, transmitter_->Start(std::move(request)));
    in_flight_[id] = InFlight{placement.transmission, task, drain_slot, model};
    residency_.Switched(placement.slot, model, placement.transmission->epoch());
  }
  flatbuffers::FlatBufferBuilder prepare;
  BuildPrepare(prepare, model, residency_.epoch(), entry.group_last_layer);
  PSWITCH_RETURN_IF_ERROR(pool_->Send(placement.slot, prepare));
  return placement;
}

void Switcher::Stalled(uint64_t id, const absl::Status& why) {
  auto it = in_flight_.find(id);
  if (it == in_flight_.end()) return;
  Event(base::LogLevel::kWarn, "transmission_stalled")
      .Field("task", it->second.task)
      .Field("epoch", it->second.transmission->epoch())
      .Field("error", why);
  // Whatever the device still does, this switch did not complete.
  residency_.Failed(it->second.transmission->epoch());
  KillUndrained(it->second, why);
}

void Switcher::KillUndrained(InFlight& flight, const absl::Status& why) {
  // The old tenant never wrote its drain value: its stream may wait on a flag no one will
  // write, so it is never reused. Its death releases the drain (WorkerPool), which lets the
  // copy stream behind it go on. Once: the slot may hold a fresh worker by the copy's end.
  if (!absl::IsDeadlineExceeded(why) || flight.drain_slot < 0) return;
  pool_->Kill(flight.drain_slot,
              absl::StrCat("killed: the worker did not drain within ",
                           absl::FormatDuration(options_.drain_timeout), " of being told to stop"));
  flight.drain_slot = -1;
}

void Switcher::Ended(uint64_t id) {
  auto it = in_flight_.find(id);
  if (it == in_flight_.end()) return;
  InFlight ended = std::move(it->second);
  in_flight_.erase(it);
  // Finished: returns at once, after retiring the groups it never published.
  absl::Status status = ended.transmission->Wait(absl::ZeroDuration()).status();
  if (status.ok()) {
    on_copy_ended_(ended.task, status);
    return;
  }
  Event(base::LogLevel::kWarn, "transmission_failed")
      .Field("task", ended.task)
      .Field("epoch", ended.transmission->epoch())
      .Field("error", status);
  // The region holds part of this model and part of whatever was there: a later task for it
  // must transmit again rather than run on partly old weights.
  residency_.Failed(ended.transmission->epoch());
  KillUndrained(ended, status);
  on_copy_ended_(ended.task, status);
}

absl::Status Switcher::Completed(uint64_t task, const std::string& model,
                                 memdaemon::Transmission& transmission, bool task_ok,
                                 SwitchTimeline& timeline, absl::Duration& copy_time) {
  // Never waits: the loop must not. A copy still running is not taken for a success (its
  // phases stay unknown and the region's trust waits for its end, Ended); the task's answer
  // stands on its worker's check of every group it used.
  const bool ended = transmission.finished();
  absl::StatusOr<std::vector<memdaemon::GroupTrace>> traces =
      ended ? transmission.Wait(absl::ZeroDuration())
            : absl::StatusOr<std::vector<memdaemon::GroupTrace>>(
                  absl::UnavailableError("the copy was still running when the task answered"));
  absl::Status failed;
  if (traces.ok() && !traces->empty()) {
    copy_time = absl::Nanoseconds(traces->back().ready_ns - traces->front().copy_start_ns);
    timeline.drained_ns = traces->front().copy_start_ns;
    timeline.first_group_ready_ns = traces->front().ready_ns;
    timeline.last_group_ready_ns = traces->back().ready_ns;
    for (const memdaemon::GroupTrace& g : *traces) {
      timeline.group_copies.emplace_back(g.copy_start_ns, g.ready_ns);
    }
  } else if (!traces.ok() && ended) {
    failed = traces.status();
  }
  // The switch as its parts, on one clock, in ms after the task's arrival (-1: did not happen).
  const SwitchTimeline& t = timeline;
  auto ms = [&t](int64_t ns) { return ns == 0 ? -1.0 : (ns - t.arrival_ns) / 1e6; };
  Event(base::LogLevel::kInfo, "task_switch")
      .Field("task", task)
      .Field("model", model)
      .Field("copy_ended", ended)
      .FieldMs("copy_ms", copy_time)
      .Field("inputs_ms", ms(t.inputs_ns))  // a raw payload's end: the switch overlapped it
      .Field("stop_sent_ms", ms(t.stop_sent_ns))
      .Field("drained_ms", ms(t.drained_ns))
      .Field("first_group_ms", ms(t.first_group_ready_ns))
      .Field("first_layer_start_ms", ms(t.first_layer_start_ns))
      .Field("first_layer_done_ms", ms(t.first_layer_done_ns))
      .Field("last_group_ms", ms(t.last_group_ready_ns))
      .Field("result_ms", ms(t.result_ns));
  // A task that failed on a switch leaves no trusted residency behind (defect 4).
  if (!task_ok || !failed.ok()) residency_.Failed(transmission.epoch());
  return failed;
}

bool Switcher::Copying(const std::string& model) const {
  for (const auto& [id, flight] : in_flight_) {
    if (flight.model == model) return true;
  }
  return false;
}

}  // namespace pswitch::controller
