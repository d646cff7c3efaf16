// Test-only: a worker "process" that is only its commands, for the worker pool's and the
// switcher's tests. The test plays the worker's side (Ready, Loaded, RunDone, Die).
#ifndef PSWITCH_CONTROLLER_FAKE_WORKER_H_
#define PSWITCH_CONTROLLER_FAKE_WORKER_H_

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "controller/worker_process.h"
#include "proto/framing.h"
#include "proto/wire_status.h"
#include "proto/worker_generated.h"

namespace pswitch::controller {

// A worker process that is only its commands: the test plays its side through `handler`.
class FakeWorker : public WorkerLink {
 public:
  FakeWorker(pid_t pid, WorkerProcess::EventHandler handler, std::vector<std::string>* log)
      : pid_(pid), handler_(std::move(handler)), log_(log) {}
  absl::Status Send(const flatbuffers::FlatBufferBuilder& command) override {
    return SendWithFd(command, -1);
  }
  // Records the command (a MapRegion with "fd" when one came with it); fails with send_error
  // instead when that is set, recording nothing (a worker whose backlog is full).
  absl::Status SendWithFd(const flatbuffers::FlatBufferBuilder& command, int fd) override {
    if (!send_error.ok()) return send_error;
    auto* c = flatbuffers::GetRoot<proto::WorkerCommand>(command.GetBufferPointer());
    std::string line = absl::StrCat(pid_, " ", proto::EnumNameWorkerCommandBody(c->body_type()));
    if (auto* load = c->body_as_LoadModel()) absl::StrAppend(&line, " ", load->name()->str());
    if (auto* stop = c->body_as_Stop()) absl::StrAppend(&line, " ", stop->drain_value());
    if (auto* prepare = c->body_as_Prepare()) {
      absl::StrAppend(&line, " ", prepare->model()->str(), " epoch ", prepare->epoch(), " at ",
                      prepare->weights_offset(), " flags ", prepare->flag_base());
    }
    if (auto* run = c->body_as_Run()) absl::StrAppend(&line, " ", run->task_id());
    if (auto* map = c->body_as_MapRegion()) {
      absl::StrAppend(&line, " ", map->region(), " ", map->bytes(), fd >= 0 ? " fd" : "");
    }
    if (auto* unmap = c->body_as_UnmapRegion()) absl::StrAppend(&line, " ", unmap->region());
    log_->push_back(line);
    return absl::OkStatus();
  }
  pid_t pid() const override { return pid_; }
  void Kill() override { ++kills; }
  absl::Time UnsentSince() const override { return unsent_since; }

  // The worker's side: what a real one would report.
  void Ready(int slot) {
    flatbuffers::FlatBufferBuilder b;
    auto body = proto::CreateWorkerReady(b, 0, static_cast<uint32_t>(slot));
    proto::Finish(b, proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::WorkerReady, body.Union()));
    Emit(b);
  }
  void Loaded(const std::string& model, const absl::Status& status = absl::OkStatus(),
              int64_t infer_step_ns = 0, int64_t train_step_ns = 0) {
    flatbuffers::FlatBufferBuilder b;
    auto error = status.ok() ? 0 : proto::CreateWireError(b, status);
    auto body = proto::CreateModelLoaded(b, b.CreateString(model), error, 0, 0, infer_step_ns,
                                         train_step_ns);
    proto::Finish(b, proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::ModelLoaded, body.Union()));
    Emit(b);
  }
  void RunDone(uint64_t task) {
    flatbuffers::FlatBufferBuilder b;
    auto body = proto::CreateRunDone(b, task);
    proto::Finish(b, proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::RunDone, body.Union()));
    Emit(b);
  }
  void RegionMapFailed(uint64_t region, const absl::Status& why) {
    flatbuffers::FlatBufferBuilder b;
    auto error = proto::CreateWireError(b, why);
    auto body = proto::CreateRegionMapFailed(b, region, error);
    proto::Finish(
        b, proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::RegionMapFailed, body.Union()));
    Emit(b);
  }
  void Heartbeat() {
    flatbuffers::FlatBufferBuilder b;
    auto body = proto::CreateHeartbeat(b);
    proto::Finish(b, proto::CreateWorkerEvent(b, 0, proto::WorkerEventBody::Heartbeat, body.Union()));
    Emit(b);
  }
  void Emit(const flatbuffers::FlatBufferBuilder& b) {
    handler_(0, std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()));
  }
  void Die(absl::string_view how) { handler_(0, absl::UnavailableError(how)); }

  int kills = 0;
  absl::Status send_error;                           // what every send returns while not OK
  absl::Time unsent_since = absl::InfiniteFuture();  // what UnsentSince reports

 private:
  const pid_t pid_;
  WorkerProcess::EventHandler handler_;
  std::vector<std::string>* log_;
};

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_FAKE_WORKER_H_
