#include "memdaemon/transmitter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace pswitch::memdaemon {
namespace {

// The one contiguous byte range holding a group's tensors (the layout is in layer order).
gpu::CopySpan GroupSpan(const StoredModel& model, grouping::LayerGroup range,
                        uint64_t weights_offset) {
  const WeightLayout& layout = model.layout();
  uint64_t begin = UINT64_MAX, end = 0;
  for (int l = range.first; l <= range.last; ++l) {
    if (layout.placements[l].empty()) continue;
    begin = std::min(begin, layout.layer_begin[l]);
    end = std::max(end, layout.layer_end[l]);
  }
  if (begin >= end) return gpu::CopySpan{};
  return gpu::CopySpan{model.host_bytes() + begin, weights_offset + begin, end - begin};
}

}  // namespace

absl::StatusOr<std::vector<GroupTrace>> Transmission::Wait(absl::Duration timeout) {
  absl::StatusOr<std::vector<gpu::GroupTiming>> timings = ticket_->Wait(timeout);
  if (!timings.ok() && !ticket_->finished()) {
    return absl::DeadlineExceededError(
        absl::StrCat("transmission of '", request_.model->name(), "' (epoch ", epoch_, ") still ",
                     ticket_->stalled() ? "stalled on the device" : "running", ": ",
                     timings.status().message()));
  }
  if (!timings.ok()) {
    absl::MutexLock lock(&mu_);
    if (!retired_) {
      retired_ = true;
      // Nothing of this epoch is in flight any more; release everyone still waiting on it.
      for (size_t g = ticket_->groups_done(); g < request_.groups.size(); ++g) {
        // Advance, not Store: a newer switch may already have published these flags.
        (void)ready_flags_->Advance(request_.flag_base + static_cast<uint32_t>(g), epoch_ + 1);
      }
    }
    return absl::Status(timings.status().code(),
                        absl::StrCat("transmission of '", request_.model->name(), "' (epoch ",
                                     epoch_, "): ", timings.status().message()));
  }
  std::vector<GroupTrace> traces(timings->size());
  for (size_t g = 0; g < traces.size(); ++g) {
    traces[g] = GroupTrace{static_cast<uint32_t>(g), request_.groups[g], (*timings)[g].bytes,
                           (*timings)[g].copy_start_ns, (*timings)[g].ready_ns};
  }
  return traces;
}

absl::StatusOr<std::shared_ptr<Transmission>> Transmitter::Start(TransmitRequest request) {
  if (request.model == nullptr) return absl::InvalidArgumentError("transmission without a model");
  const StoredModel& model = *request.model;
  absl::Status plan = grouping::ValidatePlan(request.groups, static_cast<int>(model.num_layers()));
  if (!plan.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model '", model.name(), "': ", plan.message()));
  }
  if (request.weights_offset > arena_bytes_ ||
      model.total_bytes() > arena_bytes_ - request.weights_offset) {
    return absl::OutOfRangeError(absl::StrCat("model '", model.name(), "' (", model.total_bytes(),
                                              " bytes) does not fit at arena offset ",
                                              request.weights_offset));
  }
  if (request.source_offset.has_value()) {
    const uint64_t from = *request.source_offset, bytes = model.padded_bytes();
    if (arena_base_ == nullptr) {
      return absl::FailedPreconditionError("this transmitter cannot move regions (no arena base)");
    }
    if (from > arena_bytes_ || bytes > arena_bytes_ - from ||
        bytes > arena_bytes_ - request.weights_offset) {
      return absl::OutOfRangeError(absl::StrCat("model '", model.name(), "': a move from ", from,
                                                " reaches past the arena"));
    }
    if (from < request.weights_offset + bytes && request.weights_offset < from + bytes) {
      return absl::InvalidArgumentError(absl::StrCat("model '", model.name(), "': a move from ",
                                                     from, " to ", request.weights_offset,
                                                     " overlaps itself"));
    }
  }
  gpu::CopyJob job;
  job.ready_flags = ready_flags_;
  job.ready_flag_base = request.flag_base;
  // Each span also covers the padding before it (zeros in the store) back to where the last one
  // ended, from the region's start: no byte of the memory's earlier owner stays between tensors
  // either, where a worker given the region could read it.
  uint64_t covered = request.weights_offset;
  for (const grouping::LayerGroup& range : request.groups) {
    gpu::CopyGroup group;
    gpu::CopySpan span = GroupSpan(model, range, request.weights_offset);
    if (span.bytes > 0) {
      if (span.arena_offset > covered) {
        const uint64_t gap = span.arena_offset - covered;
        span.host -= gap;
        span.arena_offset = covered;
        span.bytes += gap;
      }
      covered = span.arena_offset + span.bytes;
      group.spans.push_back(span);
    }
    job.groups.push_back(std::move(group));
  }
  // The last span runs on to the region's page end (zeros): nothing of the memory's earlier
  // owner stays in a page a worker is given (regions are whole pages: WeightsCache::RegionBytes).
  const uint64_t padded_end = request.weights_offset +
                              std::min(model.padded_bytes(), arena_bytes_ - request.weights_offset);
  for (auto g = job.groups.rbegin(); g != job.groups.rend(); ++g) {
    if (g->spans.empty()) continue;
    gpu::CopySpan& last = g->spans.back();
    const uint64_t end = last.arena_offset + last.bytes;
    if (end < padded_end) last.bytes += padded_end - end;
    break;
  }
  // A move reads the same layout, padding included, from the model's other region.
  if (request.source_offset.has_value()) {
    for (gpu::CopyGroup& group : job.groups) {
      for (gpu::CopySpan& span : group.spans) {
        span.host =
            arena_base_ + *request.source_offset + (span.arena_offset - request.weights_offset);
      }
    }
  }
  if (request.drain.has_value()) {
    job.drain_flags = drain_flags_;
    job.drain_index = request.drain->index;
    job.drain_value = request.drain->value;
    job.drain_timeout = request.drain->timeout;
  }
  job.on_finished = std::move(request.on_finished);  // not kept by the Transmission
  job.on_stalled = std::move(request.on_stalled);

  absl::MutexLock lock(&mu_);
  // A newer copy into the region of the one in flight supersedes it (PipeSwitch's single region,
  // or a cache region evicted while its copy ran): stop it before queueing behind it. A copy into
  // another region (another resident model's, while a task computes on the first) is left to
  // finish; the engine runs jobs in order, so the new one follows it.
  if (current_ != nullptr && current_->groups_done() < current_->request().groups.size()) {
    const uint64_t old_begin = current_->request().weights_offset;
    const uint64_t old_end = old_begin + current_->request().model->total_bytes();
    const uint64_t new_begin = request.weights_offset;
    const uint64_t new_end = new_begin + model.total_bytes();
    if (old_begin < new_end && new_begin < old_end) current_->Cancel();
  }
  job.epoch = next_epoch_;
  PSWITCH_ASSIGN_OR_RETURN(std::shared_ptr<gpu::CopyTicket> ticket, engine_->Submit(job));
  auto transmission = std::make_shared<Transmission>(next_epoch_, std::move(request),
                                                     std::move(ticket), ready_flags_);
  next_epoch_ += 2;
  current_ = transmission;
  return transmission;
}

}  // namespace pswitch::memdaemon
