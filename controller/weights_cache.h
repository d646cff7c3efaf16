// One GPU's weights pool as a cache of resident models (docs/architecture.md, "The weights
// cache"). Every model whose weights fit keeps its region of the pool, and its own range of ready
// flags, after it ran, so a later task for it copies nothing and gates on flags that still hold
// the epoch of the copy that brought it. Room for a model that is not resident is a free hole
// when one fits; otherwise the cheapest contiguous window of holes and resident models is
// evicted, by one of two policies:
//   - kLru: the window whose most recently used victim was used longest ago;
//   - kCostAware: the window whose victims would cost least to bring back: each one's request
//     rate (how soon it will be asked for again, estimated from its last two requests as LRU-2
//     does: two requests over the time since the older one, or one over the time since the
//     only one; requests within 1 ms count as one) times what a miss on it costs: the
//     fixed steps of any switch (miss_overhead) plus the part of its copy its compute cannot
//     hide (its copy time less its measured compute, at least its first group's share). The
//     fixed part makes every hit worth keeping where copies hide behind compute; the recency
//     keeps a model asked for once long ago from looking as hot as one asked for just now.
// Holes never refuse a model: when no hole fits, a window of resident models is evicted, so a
// model that fits in the pool always gets room (at worst at the cost of an eviction that
// compaction would have avoided). Where the operator's pinned models leave no window, one of them
// is moved (PinnedToMove: its region taken, the model copied again elsewhere, off the critical
// path). Only a model larger than the pool (or the operator's cap) is refused, or one that no
// single move of a pinned model makes room for.
//
// Training runs' optimizer state (momentum, Adam moments) takes its room in the same pool
// (ReserveState), so the pool is all the arena its activation leases leave, whether it serves
// models or trains: a state is never evicted, only saved to host memory when kept for a
// preempted task and its room is needed.
//
// With the cache off (`enabled` false) the pool holds one model at a time at its start, flags
// from 0: PipeSwitch's single weights region, the baseline the benchmarks compare against.
//
// A region's bytes are overwritten only by a later copy on the same copy engine, which runs jobs
// in order, so evicting a model whose copy is still in flight (or being retired) is safe; the
// caller decides whether the old tenant must drain first (Reservation::evicted). Not
// thread-safe: the scheduler loop owns it.
#ifndef PSWITCH_CONTROLLER_WEIGHTS_CACHE_H_
#define PSWITCH_CONTROLLER_WEIGHTS_CACHE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "controller/state_checkpoints.h"
#include "memdaemon/arena_layout.h"

namespace pswitch::controller {

enum class EvictionPolicy { kLru, kCostAware };
absl::string_view EvictionPolicyName(EvictionPolicy policy);
absl::StatusOr<EvictionPolicy> ParseEvictionPolicy(absl::string_view name);

struct WeightsCacheOptions {
  uint64_t pool_offset = 0;  // arena offset of the pool (a memdaemon lease)
  uint64_t pool_bytes = 0;
  uint32_t flag_count = 0;      // ready flags shared by every resident model's groups
  bool enabled = true;          // false: one model at a time, at the pool's start
  uint64_t capacity_bytes = 0;  // the operator's cap on resident bytes; 0: the whole pool
  // Every region starts and ends on this (the arena's access granularity: a worker given one
  // region reaches no byte of another; 2 MiB on a CUDA VMM arena). A power of two.
  uint64_t region_alignment = memdaemon::kLeaseAlignmentBytes;
  EvictionPolicy policy = EvictionPolicy::kCostAware;
  // What every miss costs besides its copy (kCostAware): the switch's own steps (the copy's
  // start, the first group's flag, the worker's wait on it). A tuning value, of the order of a
  // switch's startup beyond a ready model's on the H100 (docs/performance.md); what matters is
  // that it is not zero, so that a hit is worth keeping where every copy hides behind compute.
  absl::Duration miss_overhead = absl::Milliseconds(1);
};

// What a reload of a model costs, as the caller knows it now.
struct ReloadCost {
  double copy_s = 0;     // its bytes at the link's measured bandwidth
  double compute_s = 0;  // one task's compute, as measured (0: unknown)
  uint32_t groups = 1;
  // What of the copy a task's compute cannot hide: the rest of the copy, at least the first
  // group (no layer starts before it).
  double exposed_s() const;
};

struct ResidentModel {
  std::string model;
  uint64_t offset = 0;  // in the arena
  uint64_t bytes = 0;
  uint32_t flag_base = 0;
  uint32_t flags = 0;
  uint32_t epoch = 0;   // of the copy that brought it (0: not started yet)
  bool copying = true;  // its copy has not ended yet
  bool trusted = true;  // false: it failed; the region waits for its copy's end to be freed
  bool pinned = false;  // the operator's: never evicted
  uint64_t generation = 0;  // of the pinned weights it copied (StoredModel::generation)
  ReloadCost cost;
  // Non-zero: the training task, preempted, whose trained weights only this region holds (newer
  // than the pinned store): never a victim until written back (MarkSaved). For an optimizer
  // state: the preempted task that keeps it here for its next run, until saved to host memory.
  uint64_t unsaved_task = 0;
  // Set: not a model's weights but this training run's optimizer state (ReserveState), named
  // WeightsCache::StateName(*state_of), with no flags. Never evicted: while its run uses it
  // nothing takes it, and once kept for a preempted task (unsaved_task) it goes only when saved
  // to host memory, as unsaved weights do (RoomWait::write_back names it).
  std::optional<CheckpointKey> state_of;
  uint64_t state_bytes = 0;  // the state's own size (its region ends on the alignment)
};

// What a reservation that cannot be made now waits for (WeightsCache::RoomWait).
struct RoomWait {
  bool waits = false;  // room exists, but only where a checkpoint reads or unsaved weights are
  // Models whose unsaved training weights must be written back for that room.
  std::vector<std::string> write_back;
};

struct Reservation {
  uint64_t offset = 0;
  uint32_t flag_base = 0;
  std::vector<std::string> evicted;  // resident models whose region it takes, in address order
};

// A resident model moved into a free hole to merge free space (WeightsCache::PlanMove).
struct RegionMove {
  std::string model;
  uint64_t from = 0;  // arena offsets
  uint64_t to = 0;
  uint64_t bytes = 0;  // the region's
};

struct WeightsCacheStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  uint64_t moves = 0;           // regions moved to merge free space (Relocate)
  uint64_t resident_bytes = 0;  // trusted models' regions only
  uint32_t resident_models = 0;
  uint64_t state_bytes = 0;  // training runs' optimizer state in the pool
  uint32_t states = 0;
};

class WeightsCache {
 public:
  explicit WeightsCache(WeightsCacheOptions options);

  // `model`'s region while it is trusted (its copy may still run); null otherwise.
  const ResidentModel* Find(const std::string& model) const;
  // A task for `model` runs on its resident weights (a hit): recency and rate count it.
  void Hit(const std::string& model, int64_t now_ns);

  // Room for `model` (`bytes`, `cost.groups` flags), which is not resident: a hole when one
  // fits, else an eviction by the policy. The region is `model`'s from now on, copying, with no
  // epoch yet (Started). A trusted older region of `model` is replaced. ResourceExhausted when
  // the model is larger than the pool, the cap or the flags. `keep` (may be empty) names models
  // whose region and flags must stay untouched, as if pinned (a tenant still stopping may write
  // its region): Unavailable when only taking one of them would make room.
  // `for_request` false: a copy no task asked for (a pinned model brought in at registration),
  // which counts neither as a miss nor as demand.
  absl::StatusOr<Reservation> Reserve(const std::string& model, uint64_t bytes,
                                      const ReloadCost& cost, int64_t now_ns,
                                      const std::set<std::string>& keep = {},
                                      bool for_request = true);
  // The copy under `epoch` started into `model`'s reservation, from the pinned weights of
  // `generation`.
  void Started(const std::string& model, uint32_t epoch, uint64_t generation = 0);
  // When `model` (`bytes`, `cost.groups` flags) has no room only because the operator's pinned
  // models leave no window (fragmentation), though the pool could hold it: a pinned model whose
  // move makes room, i.e. whose region a reservation for `model` may take (Pin it false around
  // that Reserve) while a copy of it again (Reserve, for_request false) still fits apart from
  // `model`, `keep` and `keep_for_copy` (what that copy must leave alone besides). The smallest
  // such; nullopt when no single move does.
  std::optional<std::string> PinnedToMove(const std::string& model, uint64_t bytes,
                                          const ReloadCost& cost, int64_t now_ns,
                                          const std::set<std::string>& keep = {},
                                          const std::set<std::string>& keep_for_copy = {}) const;
  // A training run's checkpoint wrote `model`'s resident weights to the pinned store, which is
  // now `generation`: the region holds exactly that (and nothing unsaved any more).
  void Checkpointed(const std::string& model, uint64_t generation);
  // `model`'s region holds the weights of training task `task`, preempted, that were not
  // written back (issue 29 item 6): kept until written back (Checkpointed), or lost when
  // untrusted or dropped. No effect when the model is not resident.
  void MarkUnsaved(const std::string& model, uint64_t task);
  // The task whose unsaved weights `model`'s region holds; 0: none.
  uint64_t UnsavedTask(const std::string& model) const;
  // `model`'s copy under `epoch` ended: resident when `ok`, else its region is freed. Ignored
  // when the region no longer belongs to that copy (evicted or replaced since).
  void CopyEnded(const std::string& model, uint32_t epoch, bool ok);
  // `model`'s weights under `epoch` (0: whichever) can no longer be trusted: a task failed on
  // its switch, or a tenant died that may have written them. Freed now, or once its copy ends
  // (a reservation whose copy never started is freed at once).
  void Untrust(const std::string& model, uint32_t epoch = 0);
  // `model` was unloaded (nothing of it is copied any more): its region is freed, its pin goes.
  void Drop(const std::string& model);
  // Training runs' optimizer state lives in the pool as well (docs/architecture.md, "The weights
  // cache"). StateName(key) names `key`'s region; it is never a model's name (those hold no
  // control characters).
  static std::string StateName(CheckpointKey key);
  // Room for `key`'s optimizer state (`bytes`), which has none: a hole when one fits, else
  // models evicted as for a miss (never a pinned one, one in `keep`, a held one, unsaved
  // weights or another state; Unavailable when only those stand in the way, as Reserve). Not a
  // miss nor demand. With the cache off, states sit at the pool's end, the one model at its
  // start. The region is in use (never taken) until KeepState or FreeState.
  // `beside` (may be empty): the run's own model, whose region the state must leave as well
  // (ResourceExhausted, not Unavailable, when only it stands in the way).
  absl::StatusOr<Reservation> ReserveState(CheckpointKey key, uint64_t bytes, int64_t now_ns,
                                           const std::set<std::string>& keep = {},
                                           const std::string& beside = {});
  // `key`'s optimizer-state region; null when none.
  const ResidentModel* FindState(CheckpointKey key) const;
  // Its run was preempted: `key`'s state stays for task `task`'s next run, until a reservation
  // needs its room and it is saved to host memory (WaitsFor names it). UseState: a run of it
  // started on it again. Hold(StateName(key)) while it goes (saved, or its run's end under way
  // off the loop): a reservation waits for its room rather than fail.
  void KeepState(CheckpointKey key, uint64_t task);
  void UseState(CheckpointKey key);
  // `key`'s state is gone (saved to host memory, or dropped): its room is free.
  void FreeState(CheckpointKey key);

  // Once resident, `model` is never evicted (the operator's pin); with the cache off, a pin
  // cannot hold (one model at a time) and is ignored.
  void Pin(const std::string& model, bool pinned);

  // A training run's checkpoint reads `model`'s region off the loop: until Release, the region
  // and its flags are no victim of any reservation, and stay taken even when untrusted meanwhile
  // (counted: one hold per checkpoint). `model` itself gets no new region while held.
  void Hold(const std::string& model);
  void Release(const std::string& model);
  bool Held(const std::string& model) const { return held_.contains(model); }
  // Whether a region for `bytes` and `groups` flags exists only through a held model's region
  // or flags, or a region with unsaved weights or a kept optimizer state, or an optimizer state
  // held while it goes: the reservation must wait for the checkpoint (and for those to be
  // written back, or gone) rather than fail. `for_state`: the room is for an optimizer state
  // (ReserveState), which must also leave `in_use` (regions a copy writes or a busy tenant
  // uses: it waits for them) and `fixed` (its run's own model: never a reason to wait).
  RoomWait WaitsFor(uint64_t bytes, uint32_t groups, int64_t now_ns, bool for_state = false,
                    const std::set<std::string>& in_use = {},
                    const std::set<std::string>& fixed = {}) const;

  // More than one hole in the pool: only then can a move merge free space (PlanMove). One pass
  // over the regions, for callers to ask before gathering what PlanMove needs.
  bool Fragmented() const;

  // Compaction, off the critical path (docs/architecture.md, "The weights cache"): the move of
  // one resident model into a free hole that makes the largest hole larger, where the free
  // space is split and merging it would give room to a model that is not resident (one of
  // `wanted`, region bytes, larger than the largest hole but not than the free total);
  // nullopt when no move does, or no such model exists (a move for nothing only reshuffles
  // what the next evictions take). Only a trusted, complete region of the pinned weights (not
  // pinned by the operator, not held, no unsaved training weights, not in `keep`) moves, into
  // a hole that does not overlap it, so the copy reads what no one writes.
  std::optional<RegionMove> PlanMove(const std::set<std::string>& keep,
                                     const std::vector<uint64_t>& wanted) const;
  // Carries out `move` in the cache: `move.model`'s region is at `move.to` from now on, copying
  // (its flags and their range unchanged, Started gives the copy's epoch), and its old room is
  // free at once: whatever takes it is written by a later copy on the same engine, after this
  // one read it. FailedPrecondition when the model or the hole are no longer as planned.
  absl::StatusOr<Reservation> Relocate(const RegionMove& move);
  // Undoes a Relocate whose copy never started (its new region already freed): `before`, the
  // region as it was, is the model's again. False (nothing changed) when its room was taken
  // since, or the model has a region.
  bool Reinstate(const ResidentModel& before);

  // A task's compute on `model` was measured on resident weights, for its reload cost.
  void ObserveCompute(const std::string& model, double compute_s);

  // Every region (trusted or not), in address order.
  std::vector<ResidentModel> List() const;
  WeightsCacheStats stats() const;
  uint64_t capacity_bytes() const { return end_ - options_.pool_offset; }
  bool enabled() const { return options_.enabled; }
  // The room a model of `model_bytes` takes: whole units of `alignment` (a multiple of the
  // weight layout's alignment), so a worker's access to it, granted in such units (issue 29
  // item 2), reaches no other model. 0 for a size that would overflow.
  static uint64_t RegionBytes(uint64_t model_bytes,
                              uint64_t alignment = memdaemon::kLeaseAlignmentBytes);
  // RegionBytes at this cache's region_alignment.
  uint64_t RoomFor(uint64_t model_bytes) const {
    return RegionBytes(model_bytes, options_.region_alignment);
  }

 private:
  // A contiguous window of the pool and what taking it costs.
  struct Window {
    uint64_t offset = 0;
    std::vector<std::string> victims;
    double cost = 0;
    int64_t newest_use_ns = 0;  // of its victims (kLru's key)
    uint64_t victim_bytes = 0;
    uint64_t hole_bytes = 0;  // free bytes from `offset` to the next region
  };
  // The cheapest window of `bytes` by the policy; nullopt when none (larger than the pool).
  // `for_state`: room for an optimizer state (with the cache off: at the pool's end).
  std::optional<Window> ChooseWindow(uint64_t bytes, int64_t now_ns,
                                     const std::set<std::string>& keep,
                                     bool for_state = false) const;
  // Reserve and ReserveState: `state_of` set for a state; `fixed`: regions to leave that are
  // part of the need (not a reason to wait).
  absl::StatusOr<Reservation> ReserveRoom(const std::string& name, uint64_t bytes,
                                          const ReloadCost& cost, int64_t now_ns,
                                          const std::set<std::string>& keep, bool for_request,
                                          std::optional<CheckpointKey> state_of,
                                          const std::set<std::string>& fixed = {});
  // The cheapest flag range of `count` given that `victims` go; nullopt when none.
  std::optional<uint32_t> ChooseFlags(uint32_t count, const std::vector<std::string>& victims,
                                      int64_t now_ns, const std::set<std::string>& keep,
                                      std::vector<std::string>* more_victims) const;
  double KeepValue(const ResidentModel& r, int64_t now_ns) const;
  // A region (trusted or not) overlapping [offset, offset + bytes); null when none.
  const ResidentModel* Occupant(uint64_t offset, uint64_t bytes) const;
  // The trusted regions' models that hold unsaved training weights.
  std::set<std::string> Unsaved() const;
  void Free(std::map<uint64_t, ResidentModel>::iterator it);
  std::map<uint64_t, ResidentModel>::iterator FindRegion(const std::string& model);
  std::map<uint64_t, ResidentModel>::const_iterator FindRegion(const std::string& model) const;

  const WeightsCacheOptions options_;
  const uint64_t end_;                         // the pool's usable end (the cap applied)
  // What the policy knows of a model's demand, kept across its evictions (a hot model evicted
  // once is still hot), until it is unloaded.
  struct Demand {
    int64_t last_used_ns = 0;
    int64_t previous_use_ns = 0;  // the request before the last; 0: none
    double compute_s = 0;  // smoothed compute on resident weights (0: not measured)
  };
  // Counts a request for `model` at `now_ns`.
  void Asked(const std::string& model, int64_t now_ns);
  const Demand& DemandOf(const std::string& model) const;

  std::map<uint64_t, ResidentModel> regions_;  // arena offset -> region
  std::map<std::string, Demand> demand_;
  std::set<std::string> pinned_;  // models pinned resident
  std::multiset<std::string> held_;  // models whose region a checkpoint reads (Hold)
  WeightsCacheStats stats_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_WEIGHTS_CACHE_H_
