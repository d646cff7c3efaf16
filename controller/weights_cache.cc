#include "controller/weights_cache.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "memdaemon/arena_layout.h"

namespace pswitch::controller {
namespace {

constexpr double kNsPerS = 1e9;
// Requests closer together than this count as one (see Asked).
constexpr int64_t kCorrelatedNs = 1'000'000;

}  // namespace

absl::string_view EvictionPolicyName(EvictionPolicy policy) {
  return policy == EvictionPolicy::kLru ? "lru" : "cost";
}

absl::StatusOr<EvictionPolicy> ParseEvictionPolicy(absl::string_view name) {
  if (name == "lru") return EvictionPolicy::kLru;
  if (name == "cost") return EvictionPolicy::kCostAware;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown eviction policy '", name, "' (lru or cost)"));
}

double ReloadCost::exposed_s() const {
  const double first_group = copy_s / std::max<uint32_t>(groups, 1);
  return std::max(copy_s - compute_s, first_group);
}

WeightsCache::WeightsCache(WeightsCacheOptions options)
    : options_(options),
      // Whole units of region_alignment: every region starts on one, placed at a region's end
      // or (compaction) a hole's end, the pool's included.
      end_(options.pool_offset + (options.capacity_bytes == 0
                                      ? options.pool_bytes
                                      : std::min(options.capacity_bytes, options.pool_bytes)) /
                                     std::max<uint64_t>(options.region_alignment, 1) *
                                     std::max<uint64_t>(options.region_alignment, 1)) {}

std::map<uint64_t, ResidentModel>::iterator WeightsCache::FindRegion(const std::string& model) {
  return std::find_if(regions_.begin(), regions_.end(),
                      [&](const auto& r) { return r.second.model == model && r.second.trusted; });
}

std::map<uint64_t, ResidentModel>::const_iterator WeightsCache::FindRegion(
    const std::string& model) const {
  return std::find_if(regions_.begin(), regions_.end(),
                      [&](const auto& r) { return r.second.model == model && r.second.trusted; });
}

const ResidentModel* WeightsCache::Find(const std::string& model) const {
  auto it = FindRegion(model);
  return it == regions_.end() ? nullptr : &it->second;
}

const WeightsCache::Demand& WeightsCache::DemandOf(const std::string& model) const {
  static const Demand kNone;
  auto it = demand_.find(model);
  return it == demand_.end() ? kNone : it->second;
}

void WeightsCache::Asked(const std::string& model, int64_t now_ns) {
  Demand& d = demand_[model];
  // Requests within the correlation period of the last one count as that one (LRU-K's
  // correlated references): a placement tried again, or a burst, is not a rate of thousands.
  if (d.last_used_ns == 0 || now_ns - d.last_used_ns >= kCorrelatedNs) {
    d.previous_use_ns = d.last_used_ns;
  }
  d.last_used_ns = std::max(d.last_used_ns, now_ns);
}

double WeightsCache::KeepValue(const ResidentModel& r, int64_t now_ns) const {
  // Garbage (a failed copy waiting for its end) costs nothing to take.
  if (!r.trusted) return 0;
  const Demand& d = DemandOf(r.model);
  if (d.last_used_ns == 0) return 0;  // never asked for (a pinned model brought in)
  // LRU-2's estimate of the request rate: the last two requests over the time since the older
  // one (its backward 2-distance); a model asked for once, one request over the time since it.
  // A model asked for twice long apart thus ranks by that long interval even just after its
  // second request (as LRU-2 ranks it); letting the last request alone raise it (the larger of
  // the two estimates) gave fewer hits on the simulated traces (docs/performance.md). Times are
  // floored at the correlation period, so a request of this instant stays finite.
  auto per_s = [now_ns](double requests, int64_t since_ns) {
    return requests / (static_cast<double>(std::max(now_ns - since_ns, kCorrelatedNs)) / kNsPerS);
  };
  const double rate =
      d.previous_use_ns > 0 ? per_s(2, d.previous_use_ns) : per_s(1, d.last_used_ns);
  ReloadCost cost = r.cost;
  if (d.compute_s > 0) cost.compute_s = d.compute_s;
  return rate * (absl::ToDoubleSeconds(options_.miss_overhead) + cost.exposed_s());
}

void WeightsCache::Hit(const std::string& model, int64_t now_ns) {
  if (FindRegion(model) == regions_.end()) return;
  Asked(model, now_ns);
  ++stats_.hits;
}

std::optional<WeightsCache::Window> WeightsCache::ChooseWindow(uint64_t bytes, int64_t now_ns,
                                                               const std::set<std::string>& keep,
                                                               bool for_state) const {
  const uint64_t begin = options_.pool_offset;
  if (bytes > end_ - begin) return std::nullopt;
  // A state its run uses is never taken; a kept one, or one held while it goes (saved, or its
  // run's end under way), only where `keep` does not name it (WaitsFor: Reserve keeps both).
  auto untakable = [this, &keep](const ResidentModel& r) {
    return (r.pinned && r.trusted) || keep.contains(r.model) ||
           (r.state_of && r.unsaved_task == 0 && !held_.contains(r.model));
  };
  if (!options_.enabled) {
    // The one model at the pool's start, states below the pool's end: a model's window takes
    // every model, a state's the room under the lowest state.
    uint64_t states_begin = end_;
    for (const auto& [offset, r] : regions_) {
      if (r.state_of) states_begin = std::min(states_begin, offset);
    }
    if (for_state && states_begin - begin < bytes) return std::nullopt;
    Window all{for_state ? states_begin - bytes : begin, {}, 0, 0, 0, 0};
    for (const auto& [offset, r] : regions_) {
      const bool overlaps = offset < all.offset + bytes && all.offset < offset + r.bytes;
      if (r.state_of && !overlaps) continue;
      if (!r.state_of && for_state && !overlaps) continue;
      if (untakable(r)) return std::nullopt;  // the one region is not to be taken
      all.victims.push_back(r.model);
      all.victim_bytes += r.bytes;
    }
    return all;
  }
  // Windows start at the pool's start or at a region's end (a hole's start), and take every
  // region they overlap. Tried from each start: O(regions^2), a few hundred at most.
  std::vector<uint64_t> starts{begin};
  for (const auto& [offset, r] : regions_) starts.push_back(offset + r.bytes);
  std::optional<Window> best;
  auto better = [this](const Window& a, const Window& b) {
    if (a.victims.empty() != b.victims.empty()) return a.victims.empty();
    // Best fit among holes: a tighter hole leaves the larger ones for larger models.
    if (a.victims.empty()) return a.hole_bytes < b.hole_bytes;
    if (options_.policy == EvictionPolicy::kLru) {
      if (a.newest_use_ns != b.newest_use_ns) return a.newest_use_ns < b.newest_use_ns;
    } else if (a.cost != b.cost) {
      return a.cost < b.cost;
    }
    return a.victim_bytes < b.victim_bytes;
  };
  for (uint64_t start : starts) {
    if (start > end_ || bytes > end_ - start) continue;
    Window w{start, {}, 0, 0, 0, 0};
    auto next = regions_.lower_bound(start);
    w.hole_bytes = (next == regions_.end() ? end_ : next->first) - start;
    bool blocked = false;
    for (auto it = next; it != regions_.end() && it->first < start + bytes; ++it) {
      const ResidentModel& r = it->second;
      if (untakable(r)) {
        blocked = true;  // the operator's, a stopping tenant's, a run's state: never a victim
        break;
      }
      w.victims.push_back(r.model);
      w.victim_bytes += r.bytes;
      w.cost += KeepValue(r, now_ns);
      if (r.trusted) w.newest_use_ns = std::max(w.newest_use_ns, DemandOf(r.model).last_used_ns);
    }
    if (blocked) continue;
    if (!best || better(w, *best)) best = std::move(w);
  }
  return best;
}

std::optional<uint32_t> WeightsCache::ChooseFlags(uint32_t count,
                                                  const std::vector<std::string>& victims,
                                                  int64_t now_ns, const std::set<std::string>& keep,
                                                  std::vector<std::string>* more_victims) const {
  if (count > options_.flag_count) return std::nullopt;
  if (!options_.enabled) return 0;
  // Ranges held by regions that stay, by flag base (the pinned and kept ones apart: never
  // victims).
  std::map<uint32_t, const ResidentModel*> held, pinned;
  for (const auto& [offset, r] : regions_) {
    if (r.state_of) continue;  // no flags
    if ((r.pinned && r.trusted) || keep.contains(r.model)) {
      pinned.emplace(r.flag_base, &r);
      continue;
    }
    if (std::find(victims.begin(), victims.end(), r.model) == victims.end() &&
        std::find(more_victims->begin(), more_victims->end(), r.model) == more_victims->end()) {
      held.emplace(r.flag_base, &r);
    }
  }
  while (true) {
    std::map<uint32_t, const ResidentModel*> all = held;
    all.insert(pinned.begin(), pinned.end());
    uint32_t cursor = 0;
    for (const auto& [base, r] : all) {
      if (base >= cursor && base - cursor >= count) return cursor;
      cursor = std::max(cursor, base + r->flags);
    }
    if (options_.flag_count - cursor >= count) return cursor;
    if (held.empty()) return std::nullopt;
    // Out of flags (many resident models with per-layer plans): the cheapest holder goes too.
    auto cheapest =
        std::min_element(held.begin(), held.end(), [this, now_ns](const auto& a, const auto& b) {
          return KeepValue(*a.second, now_ns) < KeepValue(*b.second, now_ns);
        });
    more_victims->push_back(cheapest->second->model);
    held.erase(cheapest);
  }
}

void WeightsCache::Hold(const std::string& model) { held_.insert(model); }

void WeightsCache::Release(const std::string& model) {
  auto it = held_.find(model);
  if (it == held_.end()) return;
  held_.erase(it);
  if (held_.contains(model)) return;
  // Untrusted while held (a tenant's death): kept until the checkpoint read it, freed now.
  std::erase_if(regions_, [&](const auto& entry) {
    return entry.second.model == model && !entry.second.trusted && !entry.second.copying;
  });
}

RoomWait WeightsCache::WaitsFor(uint64_t bytes, uint32_t groups, int64_t now_ns, bool for_state,
                                const std::set<std::string>& in_use,
                                const std::set<std::string>& fixed) const {
  const uint64_t rounded = RoomFor(bytes);
  const std::set<std::string> unsaved = Unsaved();
  if ((held_.empty() && unsaved.empty() && in_use.empty()) || rounded == 0) return {};
  const std::set<std::string> held(held_.begin(), held_.end());
  // The window the policy would take with `keep` (and `fixed`) untouched, and its victims
  // (flags included).
  auto victims = [&](std::set<std::string> keep) -> std::optional<std::vector<std::string>> {
    keep.insert(fixed.begin(), fixed.end());
    std::optional<Window> window = ChooseWindow(rounded, now_ns, keep, for_state);
    if (!window) return std::nullopt;
    std::vector<std::string> more;
    if (!ChooseFlags(groups, window->victims, now_ns, keep, &more)) return std::nullopt;
    window->victims.insert(window->victims.end(), more.begin(), more.end());
    return window->victims;
  };
  std::set<std::string> untouchable = held;
  untouchable.insert(unsaved.begin(), unsaved.end());
  untouchable.insert(in_use.begin(), in_use.end());
  if (victims(untouchable)) return {};  // room now
  RoomWait wait;
  // What frees itself: a held optimizer state (being saved to host memory, or its run's end
  // under way) is free once that is done, and a region in use once its copy or its tenant has.
  // Room then needs no write-back.
  std::set<std::string> staying;
  for (const std::string& name : untouchable) {
    const ResidentModel* r = Find(name);
    const bool state_going = r != nullptr && r->state_of && held_.contains(name);
    if (!state_going && !in_use.contains(name)) staying.insert(name);
  }
  if (staying.size() < untouchable.size() && victims(staying)) {
    wait.waits = true;
    return wait;
  }
  std::set<std::string> held_staying;
  for (const std::string& name : held) {
    if (staying.contains(name)) held_staying.insert(name);
  }
  // Room once unsaved weights (or kept states) are written back (the held regions kept), or only
  // once a checkpoint also released its region: then whatever unsaved ones that window takes.
  std::optional<std::vector<std::string>> taken = victims(held_staying);
  if (!taken) taken = victims({});
  if (!taken) return {};  // no room at all: Reserve refuses it
  wait.waits = true;
  for (const std::string& model : *taken) {
    if (unsaved.contains(model)) wait.write_back.push_back(model);
  }
  return wait;
}

std::set<std::string> WeightsCache::Unsaved() const {
  std::set<std::string> out;
  for (const auto& [offset, r] : regions_) {
    if (r.trusted && r.unsaved_task != 0) out.insert(r.model);
  }
  return out;
}

void WeightsCache::MarkUnsaved(const std::string& model, uint64_t task) {
  auto it = FindRegion(model);
  if (it != regions_.end()) it->second.unsaved_task = task;
}

uint64_t WeightsCache::UnsavedTask(const std::string& model) const {
  auto it = FindRegion(model);
  return it == regions_.end() ? 0 : it->second.unsaved_task;
}

uint64_t WeightsCache::RegionBytes(uint64_t model_bytes, uint64_t alignment) {
  if (model_bytes == 0 || alignment == 0 || model_bytes > UINT64_MAX - alignment) return 0;
  return (model_bytes + alignment - 1) / alignment * alignment;
}

std::string WeightsCache::StateName(CheckpointKey key) {
  // \x01: no model's name holds a control character (base::CheckText).
  return absl::StrCat("\x01optimizer state of ",
                      key.owner == CheckpointKey::Owner::kTask ? "task " : "fill job ", key.id);
}

absl::StatusOr<Reservation> WeightsCache::ReserveState(CheckpointKey key, uint64_t bytes,
                                                       int64_t now_ns,
                                                       const std::set<std::string>& keep,
                                                       const std::string& beside) {
  const std::string name = StateName(key);
  if (FindState(key) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat(name.substr(1), " already has its room"));
  }
  std::set<std::string> fixed;
  if (!beside.empty()) fixed.insert(beside);
  return ReserveRoom(name, bytes, ReloadCost{.groups = 0}, now_ns, keep,
                     /*for_request=*/false, key, fixed);
}

const ResidentModel* WeightsCache::FindState(CheckpointKey key) const {
  auto it = FindRegion(StateName(key));
  return it == regions_.end() ? nullptr : &it->second;
}

void WeightsCache::KeepState(CheckpointKey key, uint64_t task) {
  auto it = FindRegion(StateName(key));
  if (it != regions_.end()) it->second.unsaved_task = task;
}

void WeightsCache::UseState(CheckpointKey key) { KeepState(key, 0); }

void WeightsCache::FreeState(CheckpointKey key) {
  const std::string name = StateName(key);
  std::erase_if(regions_, [&](const auto& r) { return r.second.model == name; });
}

absl::StatusOr<Reservation> WeightsCache::Reserve(const std::string& model, uint64_t bytes,
                                                  const ReloadCost& cost, int64_t now_ns,
                                                  const std::set<std::string>& keep,
                                                  bool for_request) {
  return ReserveRoom(model, bytes, cost, now_ns, keep, for_request, std::nullopt);
}

absl::StatusOr<Reservation> WeightsCache::ReserveRoom(const std::string& model, uint64_t bytes,
                                                      const ReloadCost& cost, int64_t now_ns,
                                                      const std::set<std::string>& asked_keep,
                                                      bool for_request,
                                                      std::optional<CheckpointKey> state_of,
                                                      const std::set<std::string>& fixed) {
  const uint64_t rounded = RoomFor(bytes);
  // How errors name it: "model 'x'", or "optimizer state of task 7".
  const std::string what = state_of ? model.substr(1) : absl::StrCat("model '", model, "'");
  const char* const contents = state_of ? " bytes of optimizer state" : " bytes of weights";
  if (rounded == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad size ", bytes));
  }
  if (held_.contains(model)) {
    return absl::UnavailableError(absl::StrCat(what, ": its region is still read by a checkpoint"));
  }
  // A region a checkpoint still reads is kept as well, and so is one whose trained weights were
  // not written back yet (WaitsFor names them).
  std::set<std::string> keep = asked_keep;
  keep.insert(fixed.begin(), fixed.end());
  keep.insert(held_.begin(), held_.end());
  const std::set<std::string> unsaved = Unsaved();
  keep.insert(unsaved.begin(), unsaved.end());
  const bool for_state = state_of.has_value();
  std::optional<Window> window = ChooseWindow(rounded, now_ns, keep, for_state);
  if (!window && keep.size() > fixed.size() && ChooseWindow(rounded, now_ns, fixed, for_state)) {
    return absl::UnavailableError(absl::StrCat(
        what,
        " has room only where a stopping tenant, a checkpoint, unsaved training weights or kept "
        "optimizer state are"));
  }
  if (!window) {
    uint64_t pinned_bytes = 0, state_bytes = 0;
    for (const auto& [offset, r] : regions_) {
      pinned_bytes += r.pinned && r.trusted ? r.bytes : 0;
      state_bytes += r.state_of ? r.bytes : 0;
    }
    if (rounded <= capacity_bytes() && (pinned_bytes > 0 || state_bytes > 0)) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, " needs ", rounded, contents, "; this GPU's weights cache holds ",
                       capacity_bytes(), ", of which pinned models (pin_resident) keep ",
                       pinned_bytes, " and training tasks' optimizer state ", state_bytes,
                       " so that no window is left for it"));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", rounded, contents, "; this GPU's weights cache holds ", capacity_bytes(),
        (capacity_bytes() < options_.pool_bytes ? " (the operator's cap)" : ""),
        fixed.empty() ? " even with every resident model evicted"
                      : absl::StrCat(" even with every resident model evicted but its run's ('",
                                     *fixed.begin(), "')")));
  }
  std::vector<std::string> more;
  std::optional<uint32_t> flags = ChooseFlags(cost.groups, window->victims, now_ns, keep, &more);
  if (!flags && !keep.empty()) {
    more.clear();
    if (ChooseFlags(cost.groups, window->victims, now_ns, {}, &more)) {
      return absl::UnavailableError(absl::StrCat(
          what, " has ready flags only where a stopping tenant's or a checkpoint's are"));
    }
  }
  if (!flags) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " has ", cost.groups, " groups; this GPU has ", options_.flag_count, " ready flags"));
  }
  Reservation out{window->offset, *flags, {}};
  std::vector<std::string> victims = window->victims;
  victims.insert(victims.end(), more.begin(), more.end());
  // The old region of `model` itself (untrusted, or being replaced) goes as well.
  for (auto it = regions_.begin(); it != regions_.end();) {
    const bool victim =
        std::find(victims.begin(), victims.end(), it->second.model) != victims.end();
    if (!victim && it->second.model != model) {
      ++it;
      continue;
    }
    if (it->second.trusted && it->second.model != model) {
      ++stats_.evictions;
      out.evicted.push_back(it->second.model);
    }
    it = regions_.erase(it);
  }
  ResidentModel r;
  r.model = model;
  r.offset = out.offset;
  r.bytes = rounded;
  r.flag_base = out.flag_base;
  r.flags = cost.groups;
  r.cost = cost;
  r.pinned = options_.enabled && pinned_.contains(model);
  if (state_of) {
    r.state_of = state_of;
    r.state_bytes = bytes;
    r.copying = false;  // filled by its run's restore, which the scheduler awaits
  }
  regions_.emplace(r.offset, std::move(r));
  if (for_request) {
    ++stats_.misses;
    Asked(model, now_ns);
  }
  return out;
}

std::optional<std::string> WeightsCache::PinnedToMove(
    const std::string& model, uint64_t bytes, const ReloadCost& cost, int64_t now_ns,
    const std::set<std::string>& keep, const std::set<std::string>& keep_for_copy) const {
  const uint64_t rounded = RoomFor(bytes);
  if (!options_.enabled || rounded == 0 || rounded > capacity_bytes()) return std::nullopt;
  std::vector<const ResidentModel*> pinned;
  for (const auto& [offset, r] : regions_) {
    // A copy still landing is not moved (its copy would be queued behind itself).
    if (r.pinned && r.trusted && !r.copying && r.model != model && !keep.contains(r.model) &&
        !held_.contains(r.model) && r.unsaved_task == 0) {
      pinned.push_back(&r);
    }
  }
  // The smallest first: the cheapest copy again (by name among equals, so the choice is stable).
  std::sort(pinned.begin(), pinned.end(), [](const ResidentModel* a, const ResidentModel* b) {
    return std::tie(a->bytes, a->model) < std::tie(b->bytes, b->model);
  });
  for (const ResidentModel* p : pinned) {
    // Tried on a copy of the cache: its reservation for `model`, then the moved one's.
    WeightsCache trial = *this;
    trial.Pin(p->model, false);
    absl::StatusOr<Reservation> room = trial.Reserve(model, bytes, cost, now_ns, keep);
    if (!room.ok() ||
        std::find(room->evicted.begin(), room->evicted.end(), p->model) == room->evicted.end()) {
      continue;
    }
    trial.Pin(p->model, true);
    std::set<std::string> apart = keep;
    apart.insert(keep_for_copy.begin(), keep_for_copy.end());
    apart.insert(model);
    if (trial.Reserve(p->model, p->bytes, p->cost, now_ns, apart, /*for_request=*/false).ok()) {
      return p->model;
    }
  }
  return std::nullopt;
}

void WeightsCache::Started(const std::string& model, uint32_t epoch, uint64_t generation) {
  for (auto& [offset, r] : regions_) {
    if (r.model == model && r.copying && r.epoch == 0) {
      r.epoch = epoch;
      r.generation = generation;
    }
  }
}

void WeightsCache::Checkpointed(const std::string& model, uint64_t generation) {
  auto it = FindRegion(model);
  if (it == regions_.end()) return;
  it->second.generation = generation;
  it->second.unsaved_task = 0;
}

void WeightsCache::CopyEnded(const std::string& model, uint32_t epoch, bool ok) {
  for (auto it = regions_.begin(); it != regions_.end(); ++it) {
    ResidentModel& r = it->second;
    if (r.model != model || r.epoch != epoch || !r.copying) continue;
    r.copying = false;
    if (!ok) r.trusted = false;
    if (!r.trusted && !held_.contains(model)) regions_.erase(it);
    return;
  }
}

void WeightsCache::Untrust(const std::string& model, uint32_t epoch) {
  for (auto it = regions_.begin(); it != regions_.end();) {
    ResidentModel& r = it->second;
    if (r.model != model || (epoch != 0 && r.epoch != epoch)) {
      ++it;
      continue;
    }
    r.trusted = false;
    // A copy still in flight writes the region until it ends (CopyEnded frees it then); one that
    // never started (epoch 0) writes nothing. A checkpoint still reading it keeps it until
    // Release: its bytes must not be handed out under the read.
    const bool in_use = (r.copying && r.epoch != 0) || held_.contains(r.model);
    it = in_use ? std::next(it) : regions_.erase(it);
  }
}

void WeightsCache::Drop(const std::string& model) {
  std::erase_if(regions_, [&](const auto& r) { return r.second.model == model; });
  pinned_.erase(model);
  demand_.erase(model);
}

void WeightsCache::Pin(const std::string& model, bool pinned) {
  if (pinned) {
    pinned_.insert(model);
  } else {
    pinned_.erase(model);
  }
  for (auto& [offset, r] : regions_) {
    if (r.model == model) r.pinned = pinned && options_.enabled;
  }
}

void WeightsCache::ObserveCompute(const std::string& model, double compute_s) {
  if (compute_s <= 0) return;
  double& c = demand_[model].compute_s;
  c = c == 0 ? compute_s : 0.8 * c + 0.2 * compute_s;  // smoothed: one slow task is no trend
}

bool WeightsCache::Fragmented() const {
  int holes = 0;
  uint64_t at = options_.pool_offset;
  for (const auto& [offset, r] : regions_) {
    if (offset > at) ++holes;
    at = std::max(at, offset + r.bytes);
  }
  if (end_ > at) ++holes;
  return holes >= 2;
}

std::optional<RegionMove> WeightsCache::PlanMove(const std::set<std::string>& keep,
                                                 const std::vector<uint64_t>& wanted) const {
  if (!options_.enabled) return std::nullopt;
  // The largest hole among `taken` ranges (begin, end), sorted.
  auto largest_hole = [this](const std::vector<std::pair<uint64_t, uint64_t>>& taken) {
    uint64_t at = options_.pool_offset, largest = 0;
    for (const auto& [begin, end] : taken) {
      if (begin > at) largest = std::max(largest, begin - at);
      at = std::max(at, end);
    }
    return end_ > at ? std::max(largest, end_ - at) : largest;
  };
  std::vector<std::pair<uint64_t, uint64_t>> taken;
  std::vector<std::pair<uint64_t, uint64_t>> holes;
  uint64_t at = options_.pool_offset;
  for (const auto& [offset, r] : regions_) {
    taken.emplace_back(offset, offset + r.bytes);
    if (offset > at) holes.emplace_back(at, offset);
    at = std::max(at, offset + r.bytes);
  }
  if (end_ > at) holes.emplace_back(at, end_);
  if (holes.size() < 2) return std::nullopt;  // one hole (or none): nothing to merge
  const uint64_t largest = largest_hole(taken);
  uint64_t free_total = 0;
  for (const auto& [begin, end] : holes) free_total += end - begin;
  if (std::none_of(wanted.begin(), wanted.end(),
                   [&](uint64_t bytes) { return bytes > largest && bytes <= free_total; })) {
    return std::nullopt;
  }
  const std::set<std::string> unsaved = Unsaved();
  // The move that leaves the largest hole; among equals one up the pool (regions gather at its
  // end, free space at its start, where an eviction's window for a large model begins, so the
  // small models gathered at the end stay out of it), then the fewest bytes, then the nearest.
  std::optional<RegionMove> best;
  uint64_t best_largest = largest;
  auto better = [&best](const RegionMove& m) {
    const bool up = m.to > m.from, best_up = best->to > best->from;
    if (up != best_up) return up;
    if (m.bytes != best->bytes) return m.bytes < best->bytes;
    auto distance = [](const RegionMove& x) {
      return std::max(x.from, x.to) - std::min(x.from, x.to);
    };
    return distance(m) < distance(*best);
  };
  for (const auto& [offset, r] : regions_) {
    if (!r.trusted || r.copying || r.pinned || r.state_of || keep.contains(r.model) ||
        held_.contains(r.model) || unsaved.contains(r.model)) {
      continue;
    }
    for (const auto& [hole_begin, hole_end] : holes) {
      if (hole_end - hole_begin < r.bytes) continue;
      // At either end of the hole (a hole beside the region too: sliding it can merge).
      for (const uint64_t to : {hole_begin, hole_end - r.bytes}) {
        std::vector<std::pair<uint64_t, uint64_t>> after;
        for (const auto& range : taken) {
          if (range.first != offset) after.push_back(range);
        }
        after.emplace_back(to, to + r.bytes);
        std::sort(after.begin(), after.end());
        const uint64_t merged = largest_hole(after);
        const RegionMove move{r.model, offset, to, r.bytes};
        if (merged > best_largest || (best && merged == best_largest && better(move))) {
          best_largest = merged;
          best = move;
        }
      }
    }
  }
  return best;
}

absl::StatusOr<Reservation> WeightsCache::Relocate(const RegionMove& move) {
  auto it = FindRegion(move.model);
  if (it == regions_.end() || it->first != move.from || it->second.copying ||
      it->second.bytes != move.bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", move.model, "' is no longer resident as the move planned"));
  }
  // The destination must still be free.
  if (const ResidentModel* r = Occupant(move.to, move.bytes); r != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the room at ", move.to, " for model '", move.model, "' is taken by '", r->model, "'"));
  }
  if (move.to < options_.pool_offset || move.to + move.bytes > end_) {
    return absl::OutOfRangeError(absl::StrCat("the room at ", move.to, " is outside the pool"));
  }
  ResidentModel moved = it->second;
  regions_.erase(it);
  moved.offset = move.to;
  moved.epoch = 0;
  moved.copying = true;
  const Reservation room{move.to, moved.flag_base, {}};
  regions_.emplace(move.to, std::move(moved));
  ++stats_.moves;
  return room;
}

const ResidentModel* WeightsCache::Occupant(uint64_t offset, uint64_t bytes) const {
  for (const auto& [at, r] : regions_) {
    if (at < offset + bytes && offset < at + r.bytes) return &r;
  }
  return nullptr;
}

bool WeightsCache::Reinstate(const ResidentModel& before) {
  if (FindRegion(before.model) != regions_.end() ||
      Occupant(before.offset, before.bytes) != nullptr) {
    return false;
  }
  regions_.emplace(before.offset, before);
  if (stats_.moves > 0) --stats_.moves;
  return true;
}

std::vector<ResidentModel> WeightsCache::List() const {
  std::vector<ResidentModel> out;
  for (const auto& [offset, r] : regions_) out.push_back(r);
  return out;
}

WeightsCacheStats WeightsCache::stats() const {
  WeightsCacheStats s = stats_;
  for (const auto& [offset, r] : regions_) {
    if (r.state_of) {
      s.state_bytes += r.bytes;
      ++s.states;
      continue;
    }
    if (!r.trusted) continue;
    s.resident_bytes += r.bytes;
    ++s.resident_models;
  }
  return s;
}

}  // namespace pswitch::controller
