#include "controller/switcher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "controller/worker_commands.h"
#include "memdaemon/arena_layout.h"

namespace pswitch::controller {

using registry::CatalogEntry;

Switcher::Switcher(SwitcherOptions options, memdaemon::Transmitter* transmitter, WorkerPool* pool,
                   std::shared_ptr<EventLoop> loop, CopyEnded on_copy_ended)
    : options_(options),
      transmitter_(transmitter),
      pool_(pool),
      loop_(std::move(loop)),
      on_copy_ended_(std::move(on_copy_ended)),
      cache_(options_.cache) {}

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

ReloadCost Switcher::CostOf(const CatalogEntry& entry) const {
  // Until a copy was measured, a nominal 10 GB/s (between the host backend's memcpy and PCIe 4):
  // what matters to the policy is how models compare, which bytes alone already say.
  const double bandwidth = link_bytes_per_s_ > 0 ? link_bytes_per_s_ : 10e9;
  ReloadCost cost;
  cost.copy_s = static_cast<double>(entry.weight_bytes) / bandwidth;
  cost.groups = static_cast<uint32_t>(std::max<size_t>(entry.plan.size(), 1));
  return cost;
}

RoomWait Switcher::WaitsForRoom(const CatalogEntry& entry, uint64_t state_bytes,
                                CheckpointKey state) const {
  const std::string& model = entry.request.name;
  const int64_t now_ns = base::MonotonicNowNs();
  // A resident copy of the pinned store's generation is a hit; a stale one is a miss (Place).
  const ResidentModel* r = cache_.Find(model);
  const bool hit =
      r != nullptr && (r->generation == entry.stored->generation() || r->unsaved_task != 0);
  if (!hit) {
    RoomWait weights = cache_.WaitsFor(entry.stored->total_bytes(), CostOf(entry).groups, now_ns);
    if (weights.waits) return weights;
  }
  if (state_bytes == 0 || cache_.FindState(state) != nullptr) return {};
  // A move's source is free in the cache at once but read until its copy ends, and a state's
  // room is written at once (not behind the copy engine): none is taken while a move runs.
  if (MoveInFlight()) return RoomWait{.waits = true};
  // The state's room once the weights have theirs: tried on a copy of the cache, as Place and
  // ReserveState would take them (apart from what is in use and from the run's own model).
  WeightsCache trial = cache_;
  if (!hit && !trial
                   .Reserve(model, entry.stored->total_bytes(), CostOf(entry), now_ns, {},
                            /*for_request=*/false)
                   .ok()) {
    return {};  // Place says why
  }
  return trial.WaitsFor(state_bytes, 0, now_ns, /*for_state=*/true, InUse({}), {model});
}

bool Switcher::MoveInFlight() const {
  return std::any_of(in_flight_.begin(), in_flight_.end(),
                     [](const auto& f) { return f.second.move; });
}

absl::StatusOr<uint64_t> Switcher::ReserveState(CheckpointKey state, uint64_t bytes,
                                                const std::string& model) {
  if (MoveInFlight()) {
    return absl::UnavailableError("optimizer state: a move on the device is under way");
  }
  PSWITCH_ASSIGN_OR_RETURN(
      Reservation room,
      cache_.ReserveState(state, bytes, base::MonotonicNowNs(), InUse({}), model));
  // Named as in errors, without the name's leading control character.
  Evicted(room, WeightsCache::StateName(state).substr(1));
  return room.offset;
}

WorkerPool::Outlook Switcher::ForModel(const std::string& model, absl::Status* never) const {
  // Its weights are being read for a checkpoint (and, should that fail, untrusted after).
  if (cache_.Held(model)) return WorkerPool::Outlook::kLater;
  const bool resident = cache_.Find(model) != nullptr;
  int busy = 0;
  for (const auto& [slot, tenant] : tenants_) {
    if (pool_->Idle(slot)) continue;
    ++busy;
    if (resident && tenant.model == model) return WorkerPool::Outlook::kLater;
  }
  // A copy waits for at most one old tenant's drain: with two abandoned runs still busy, a new
  // region could overlap both, so a miss waits until one of them is done (or killed).
  if (!resident && busy > 1) return WorkerPool::Outlook::kLater;
  return pool_->ForModel(model, never);
}

// The scheduler places a task only once the last one has answered (and its copy has ended, and a
// training run's checkpoint has read its region): every worker is idle then, but for one whose
// run was abandoned (past its deadline) or whose death is not handled yet. That is what keeps a
// region from being evicted under a worker that computes on it; the busy-tenant rules below
// (ForModel, the drain on overlap) are for those exceptions.
absl::StatusOr<Switcher::Placement> Switcher::Place(uint64_t task, const CatalogEntry& entry,
                                                    SwitchTimeline& timeline, const Ahead* ahead) {
  const std::string& model = entry.request.name;
  const int64_t now_ns = base::MonotonicNowNs();
  Placement placement;
  const int active = active_slot_;
  PrepareSpec prepare{model, 0, 0, 0, entry.group_last_layer};
  const ResidentModel* resident = cache_.Find(model);
  // Unsaved training weights are newer than any pinned generation: they stay, and their
  // write-back is what the pinned store gets next (the latest writer wins, as for checkpoints).
  if (resident != nullptr && resident->generation != entry.stored->generation() &&
      resident->unsaved_task == 0) {
    // A training run elsewhere (another GPU) checkpointed newer weights since this copy.
    Event(base::LogLevel::kInfo, "weights_stale")
        .Field("model", model)
        .Field("resident_generation", resident->generation)
        .Field("pinned_generation", entry.stored->generation());
    cache_.Untrust(model, resident->epoch);
    resident = nullptr;
  }
  if (resident != nullptr) {
    // A hit: its own flags still hold the epoch of the copy that brought it (or will, as that
    // copy goes on), so the worker gates exactly as on the switch.
    if (ahead != nullptr) {
      placement.slot = pool_->UsableOther(model, ahead->busy_slot);
    } else {
      placement.slot = pool_->Usable(active, model) ? active : pool_->UsableOther(model, active);
    }
    if (placement.slot < 0) {
      return absl::UnavailableError(absl::StrCat("no free worker holds model '", model, "'"));
    }
    cache_.Hit(model, now_ns);
    prepare.epoch = resident->epoch;
    prepare.flag_base = resident->flag_base;
    prepare.weights_offset = resident->offset;
    placement.weights_offset = resident->offset;
  } else {
    // Placed ahead: a worker other than the stopping tenant's, or no placement at all.
    const int ahead_slot = ahead != nullptr ? pool_->UsableOther(model, ahead->busy_slot) : -1;
    if (ahead != nullptr && ahead_slot < 0) {
      return absl::UnavailableError(absl::StrCat("no free standby worker for model '", model, "'"));
    }
    const std::set<std::string> keep = ahead != nullptr ? ahead->keep : std::set<std::string>{};
    const ReloadCost cost = CostOf(entry);
    absl::StatusOr<Reservation> reserved =
        cache_.Reserve(model, entry.stored->total_bytes(), cost, now_ns, keep);
    if (absl::IsResourceExhausted(reserved.status())) {
      // Pinned models leave no window though the pool could hold it: one of them moves, its
      // region taken now and its copy again queued behind this one (the caller's Preload).
      if (std::optional<std::string> moved = cache_.PinnedToMove(model, entry.stored->total_bytes(),
                                                                 cost, now_ns, keep, InUse({}))) {
        cache_.Pin(*moved, false);
        reserved = cache_.Reserve(model, entry.stored->total_bytes(), cost, now_ns, keep);
        cache_.Pin(*moved, true);
        if (reserved.ok()) {
          Event(base::LogLevel::kInfo, "pinned_weights_moved")
              .Field("model", *moved)
              .Field("for", model);
          // Its copy again is queued behind this placement's (posted), even should the rest of
          // the placement fail.
          if (on_pinned_moved_) {
            loop_->Post([moved = *moved, model, cb = on_pinned_moved_] { cb(moved, model); });
          }
        }
      }
    }
    PSWITCH_RETURN_IF_ERROR(reserved.status());
    const Reservation& room = *reserved;
    Evicted(room, model);
    // A standby (not the active worker) takes the new model: the active one drains meanwhile.
    placement.slot = ahead != nullptr ? ahead_slot : pool_->UsableOther(model, active);
    if (placement.slot < 0) placement.slot = active;
    const uint64_t bytes = entry.stored->total_bytes();
    std::optional<memdaemon::DrainCondition> drain;
    int drain_slot = -1;
    // A busy old tenant (an abandoned run) may still write the region it ran on: a copy over
    // that region waits, on the copy stream, for it to drain. An idle one has nothing in flight
    // (its RunDone came after its stream synchronised), and a copy elsewhere waits for nobody.
    // ForModel let this miss through with at most one busy tenant.
    for (const auto& [slot, tenant] : tenants_) {
      const bool overlaps =
          tenant.offset < room.offset + bytes && room.offset < tenant.offset + tenant.bytes;
      if (!overlaps || pool_->Idle(slot) || drain_slot >= 0) continue;
      if (std::optional<uint32_t> value = Stop(slot)) {
        drain =
            memdaemon::DrainCondition{static_cast<uint32_t>(slot), *value, options_.drain_timeout};
        drain_slot = slot;
        timeline.stop_sent_ns = last_stop_sent_ns_;
      }
    }
    PSWITCH_ASSIGN_OR_RETURN(placement.transmission,
                             Transmit(task, entry, room, drain, drain_slot));
    prepare.epoch = placement.transmission->epoch();
    prepare.flag_base = room.flag_base;
    prepare.weights_offset = room.offset;
    placement.weights_offset = room.offset;
  }
  active_slot_ = placement.slot;
  tenants_[placement.slot] =
      Tenant{model, placement.weights_offset, entry.stored->total_bytes(), prepare.epoch};
  flatbuffers::FlatBufferBuilder b;
  BuildPrepare(b, prepare);
  PSWITCH_RETURN_IF_ERROR(pool_->Send(placement.slot, b));
  return placement;
}

absl::Status Switcher::Preload(const CatalogEntry& entry, std::set<std::string> keep) {
  const std::string& model = entry.request.name;
  if (cache_.Find(model) != nullptr) return absl::OkStatus();
  keep = InUse(std::move(keep));
  const uint64_t bytes = entry.stored->total_bytes();
  PSWITCH_ASSIGN_OR_RETURN(Reservation room,
                           cache_.Reserve(model, bytes, CostOf(entry), base::MonotonicNowNs(), keep,
                                          /*for_request=*/false));
  Evicted(room, model);
  return Transmit(/*task=*/0, entry, room, std::nullopt, -1).status();
}

std::optional<RegionMove> Switcher::PlanMove(const std::vector<uint64_t>& wanted) const {
  if (!in_flight_.empty() || moves_paused_) return std::nullopt;
  return cache_.PlanMove(InUse({}), wanted);
}

absl::Status Switcher::Move(const CatalogEntry& entry, const RegionMove& move) {
  const ResidentModel* resident = cache_.Find(move.model);
  if (resident == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("model '", move.model, "' is not resident"));
  }
  if (resident->generation != entry.stored->generation()) {
    // Older than the pinned store (another GPU's training saved newer weights): its next task
    // copies it again anyway (Place), so its room is free now rather than moved.
    cache_.Untrust(move.model, resident->epoch);
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", move.model, "' holds older weights than the pinned store: freed, not moved"));
  }
  const ResidentModel before = *resident;
  PSWITCH_ASSIGN_OR_RETURN(Reservation room, cache_.Relocate(move));
  absl::StatusOr<std::shared_ptr<memdaemon::Transmission>> started =
      Transmit(/*task=*/0, entry, room, std::nullopt, -1, move.from);
  if (!started.ok()) {
    // Nothing was queued: the model stays where it was, and no more moves are tried until a
    // copy succeeds (an engine that refuses one would refuse the next, model after model).
    cache_.Reinstate(before);
    moves_paused_ = true;
    return started.status();
  }
  Event(base::LogLevel::kInfo, "weights_moved")
      .Field("model", move.model)
      .Field("from", move.from)
      .Field("to", move.to)
      .Field("bytes", move.bytes);
  return absl::OkStatus();
}

std::set<std::string> Switcher::InUse(std::set<std::string> keep) const {
  // Nothing in use is taken: a busy tenant's region, and every region a copy still writes (a
  // task placed with its Run held is idle on its worker, its copy under way).
  for (const auto& [slot, tenant] : tenants_) {
    if (!pool_->Idle(slot)) keep.insert(tenant.model);
  }
  for (const auto& [id, flight] : in_flight_) keep.insert(flight.model);
  return keep;
}

absl::StatusOr<std::shared_ptr<memdaemon::Transmission>> Switcher::Transmit(
    uint64_t task, const CatalogEntry& entry, const Reservation& room,
    std::optional<memdaemon::DrainCondition> drain, int drain_slot,
    std::optional<uint64_t> source) {
  const std::string& model = entry.request.name;
  memdaemon::TransmitRequest request;
  request.model = entry.stored;
  request.groups = entry.plan;
  request.weights_offset = room.offset;
  request.flag_base = room.flag_base;
  request.drain = drain;
  request.source_offset = source;
  // The copy engine reports the end; the handler runs on the loop after this one, by when
  // in_flight_ holds the transmission.
  const uint64_t id = next_id_++;
  request.on_finished = [this, id, loop = loop_] { loop->Post([this, id] { Ended(id); }); };
  request.on_stalled = [this, id, loop = loop_](const absl::Status& why) {
    loop->Post([this, id, why] { Stalled(id, why); });
  };
  absl::StatusOr<std::shared_ptr<memdaemon::Transmission>> started =
      transmitter_->Start(std::move(request));
  if (!started.ok()) {
    cache_.Untrust(model);  // nothing was queued: the reservation is freed at once
    return started.status();
  }
  cache_.Started(model, (*started)->epoch(), entry.stored->generation());
  in_flight_[id] =
      InFlight{*started, task, drain_slot, model, entry.stored->total_bytes(), source.has_value()};
  return started;
}

void Switcher::Evicted(const Reservation& room, const std::string& model) const {
  for (const std::string& evicted : room.evicted) {
    Event(base::LogLevel::kInfo, "weights_evicted")
        .Field("model", evicted)
        .Field("for", model)
        .Field("policy", EvictionPolicyName(options_.cache.policy));
    if (on_evicted_) on_evicted_(evicted, model);
  }
}

void Switcher::SlotDied(int slot, bool was_busy) {
  auto it = tenants_.find(slot);
  if (it == tenants_.end()) return;
  // Only the copy it ran on: a later copy of the model, elsewhere, is no concern of its death.
  // An idle worker had nothing in flight (its RunDone came after its stream synchronised), so
  // it wrote nothing when it died: its region stays, unsaved training weights included.
  if (was_busy) cache_.Untrust(it->second.model, it->second.epoch);
  tenants_.erase(it);
  if (active_slot_ == slot) active_slot_ = -1;
}

std::string Switcher::active_model() const {
  auto it = tenants_.find(active_slot_);
  if (it == tenants_.end() || cache_.Find(it->second.model) == nullptr) return {};
  return it->second.model;
}

void Switcher::Stalled(uint64_t id, const absl::Status& why) {
  auto it = in_flight_.find(id);
  if (it == in_flight_.end()) return;
  Event(base::LogLevel::kWarn, "transmission_stalled")
      .Field("task", it->second.task)
      .Field("epoch", it->second.transmission->epoch())
      .Field("error", why);
  // Whatever the device still does, this switch did not complete.
  cache_.Untrust(it->second.model, it->second.transmission->epoch());
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
  absl::StatusOr<std::vector<memdaemon::GroupTrace>> traces =
      ended.transmission->Wait(absl::ZeroDuration());
  cache_.CopyEnded(ended.model, ended.transmission->epoch(), traces.ok());
  // A failed move loses its model (copied again at its next request); moves pause until a copy
  // succeeds, so a failing engine does not take the resident models one by one.
  moves_paused_ = !traces.ok() && (moves_paused_ || ended.move);
  if (traces.ok()) {
    if (!ended.move && !traces->empty() &&
        traces->back().ready_ns > traces->front().copy_start_ns) {
      const double s = (traces->back().ready_ns - traces->front().copy_start_ns) / 1e9;
      const double measured = static_cast<double>(ended.bytes) / s;
      link_bytes_per_s_ =
          link_bytes_per_s_ == 0 ? measured : 0.8 * link_bytes_per_s_ + 0.2 * measured;
    }
    on_copy_ended_(ended.task, ended.transmission->epoch(), absl::OkStatus());
    return;
  }
  const absl::Status& status = traces.status();
  Event(base::LogLevel::kWarn, "transmission_failed")
      .Field("task", ended.task)
      .Field("epoch", ended.transmission->epoch())
      .Field("error", status);
  // The region holds part of this model and part of whatever was there: a later task for it
  // must transmit again rather than run on partly old weights (CopyEnded freed the region).
  KillUndrained(ended, status);
  on_copy_ended_(ended.task, ended.transmission->epoch(), status);
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
      .Field("old_stopped_ms", ms(t.old_stopped_ns))
      .Field("drained_ms", ms(t.drained_ns))
      .Field("first_group_ms", ms(t.first_group_ready_ns))
      .Field("first_layer_start_ms", ms(t.first_layer_start_ns))
      .Field("first_layer_done_ms", ms(t.first_layer_done_ns))
      .Field("last_group_ms", ms(t.last_group_ready_ns))
      .Field("result_ms", ms(t.result_ns));
  // A task that failed on a switch leaves no trusted residency behind (defect 4).
  if (!task_ok || !failed.ok()) cache_.Untrust(model, transmission.epoch());
  return failed;
}

bool Switcher::Copying(const std::string& model) const {
  for (const auto& [id, flight] : in_flight_) {
    if (flight.model == model) return true;
  }
  return false;
}

}  // namespace pswitch::controller
