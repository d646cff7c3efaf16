// Every client request pswitchd acts on, read from its verified FlatBuffer and checked field by
// field before any handler sees it: strings are UTF-8 without control characters within a
// length, enums are known values, durations are bounded. Nothing a client sent is echoed in an
// error. Pure functions of the message, without torch, so the fuzzer drives them directly
// (fuzz/fuzz_client_request.cc).
#ifndef PSWITCH_FRONTEND_REQUESTS_H_
#define PSWITCH_FRONTEND_REQUESTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/fill_request.h"
#include "controller/task_queue.h"
#include "controller/task_spec.h"
#include "fill/bubble_cycle.h"
#include "proto/client_generated.h"
#include "proto/host_tensor.h"

namespace pswitch::frontend {

using controller::FillRequest;
using controller::kFillModelPrefix;
using controller::TaskKind;

inline constexpr size_t kMaxNameBytes = 128;
inline constexpr size_t kMaxPathBytes = 4096;
inline constexpr size_t kMaxInputTensors = 16;
inline constexpr size_t kMaxTrainers = 256;

// A model registration as the registry takes it: a repository name, or (local use) an
// architecture and server files (resolved later: ResolveModelRequest), the batch as sent (0 and
// bounds are Controller::Register's to refuse), who may train it besides admins.
absl::StatusOr<registry::ModelRequest> ParseRegistration(const proto::RegisterModel& wire);
// The model an unload names (whether a fill job still owns it is FillManager::CheckUnload's).
absl::StatusOr<std::string> ParseUnload(const proto::UnloadModel& wire);
absl::Status CheckUnloadName(const std::string& name);

// An inference or training task as the scheduler takes it (its deadline `now` plus the
// client's), with what only the front end acts on.
struct ParsedTask {
  controller::TaskSpec spec;
  std::string as_model;  // training: a new copy's name (TaskAdmission::SubmitOnCopy); empty: none
  // SubmitTask.outputs_place Payload: the outputs go in a raw payload after the reply (its
  // slice is placed with the payload's staging); Region sets spec.outputs_to, checked by
  // admission to be the caller's.
  bool outputs_in_payload = false;
};
absl::StatusOr<ParsedTask> ParseTask(const proto::SubmitTask& wire, absl::Time now);
// An online fill request's latency objective as a client sent it (microseconds; TCP's
// online_slo_us, HTTP's "pswitch_online_slo_ms" parameter): inference only, in
// (0, controller::kMaxOnlineObjective].
absl::StatusOr<absl::Duration> ParseOnlineObjective(uint64_t objective_us, TaskKind kind);

absl::StatusOr<FillRequest> ParseFill(const proto::FillSubmit& wire);

// A GPU's repeating bubble cycle, with its origin on this node's clock.
struct CycleRequest {
  int gpu = 0;
  fill::BubbleCycle cycle;
  std::optional<absl::Time> origin;
};
// `now_ns`/`now` are CLOCK_MONOTONIC and wall time read together (the main job's origin_ns is
// on the monotonic clock of this node).
absl::StatusOr<CycleRequest> ParseCycle(const proto::RegisterBubbleCycle& wire, uint64_t now_ns,
                                        absl::Time now);

// A bubble instruction's begin.
struct BubbleBeginRequest {
  int gpu = 0;
  absl::Duration expected;
  uint64_t free_bytes = 0;
  uint64_t began_ns = 0;
};
BubbleBeginRequest ParseBubbleBegin(const proto::BubbleBegin& wire);

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_REQUESTS_H_
