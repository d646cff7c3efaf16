// A real worker process (host backend) driven over its control socket as pswitchd drives it:
// MapRegion with the region's memory file, Runs whose inputs and outputs lie in the region, a
// client that shrinks its shared-memory file mid-stream, and UnmapRegion. The worker must answer
// every Run (failing only the Runs the region's owner broke) and keep serving.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status.h"
#include "gmock/gmock.h"
#include "grouping/baselines.h"
#include "gtest/gtest.h"
#include "memdaemon/memdaemon.h"
#include "models/registry.h"
#include "proto/frame_channel.h"
#include "proto/framing.h"
#include "proto/host_tensor.h"
#include "proto/wire_status.h"
#include "proto/worker_generated.h"
#include "worker/host_tensors.h"
#include "worker/model_binding.h"
#include "worker/warm_up.h"

namespace pswitch::worker {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kRegion = 11;
constexpr uint64_t kRegionBytes = 1 << 20;
constexpr uint64_t kOutputsAt = 512 << 10;
const absl::Duration kAnswerTimeout = absl::Seconds(60);

// A client's /dev/shm-like segment: a memory file with no seals, which it may shrink at will;
// or (`sealed`) a Unix-socket client's area, sealed against shrinking.
class ClientSegment {
 public:
  explicit ClientSegment(bool sealed = false) {
    fd_.Reset(::memfd_create("worker-region-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    Resize(kRegionBytes);
    if (sealed) {
      EXPECT_EQ(::fcntl(fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
    }
    data_ = static_cast<uint8_t*>(
        ::mmap(nullptr, kRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0));
  }
  ~ClientSegment() { ::munmap(data_, kRegionBytes); }
  void Resize(uint64_t bytes) { ASSERT_EQ(::ftruncate(fd_.get(), static_cast<off_t>(bytes)), 0); }
  uint8_t* data() { return data_; }
  int fd() const { return fd_.get(); }

 private:
  UniqueFd fd_;
  uint8_t* data_ = nullptr;
};

struct RunAnswer {
  absl::Status status;
  std::vector<proto::HostTensor> outputs;
};

class WorkerRegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("pswitch-worker-region-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    const std::string socket_path = (dir_ / "m.sock").string();
    memdaemon::MemDaemonOptions options;
    options.arena_bytes = 64 << 20;
    options.device.backend = gpu::Backend::kHost;
    options.device.lock_host_memory = false;
    options.socket_path = socket_path;
    absl::StatusOr<std::unique_ptr<memdaemon::MemDaemon>> daemon =
        memdaemon::MemDaemon::Create(options);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);

    // The real worker binary, spawned as pswitchd spawns it: an inherited control socket and a
    // pipe with the one-time attach secret.
    int control[2];
    int secret[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, control), 0);
    ASSERT_EQ(::pipe2(secret, O_CLOEXEC), 0);
    control_ = std::make_unique<proto::FrameChannel>(UniqueFd(control[0]));
    UniqueFd child_control(control[1]);
    UniqueFd secret_in(secret[0]);
    UniqueFd secret_out(secret[1]);
    // Inheritable copies, made before the fork: the child only execs.
    UniqueFd inherited_control(::fcntl(child_control.get(), F_DUPFD, 100));
    UniqueFd inherited_secret(::fcntl(secret_in.get(), F_DUPFD, 100));
    ASSERT_TRUE(inherited_control.valid() && inherited_secret.valid());
    std::vector<std::string> args = {PSWITCH_WORKER_PATH,
                                     "--worker_id=1",
                                     "--backend=host",
                                     "--control_fd=" + std::to_string(inherited_control.get()),
                                     "--attach_secret_fd=" + std::to_string(inherited_secret.get()),
                                     "--memdaemon_socket=" + socket_path};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    child_ = ::fork();
    ASSERT_GE(child_, 0);
    if (child_ == 0) {
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    inherited_control.Reset();
    inherited_secret.Reset();
    child_control.Reset();
    secret_in.Reset();
    absl::StatusOr<std::string> issued = daemon_->IssueAttachSecret();
    ASSERT_TRUE(issued.ok()) << issued.status();
    ASSERT_EQ(::write(secret_out.get(), issued->data(), issued->size()),
              static_cast<ssize_t>(issued->size()));
    secret_out.Reset();
    ASSERT_TRUE(Next(proto::WorkerEventBody::WorkerReady).ok());
    LoadTinyCnn();
  }

  void TearDown() override {
    control_.reset();  // EOF: the worker's Serve returns
    if (child_ > 0) {
      int wstatus = 0;
      EXPECT_EQ(::waitpid(child_, &wstatus, 0), child_);
      EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)
          << "the worker ended with status " << wstatus;
    }
    daemon_.reset();
    (void)base::RemoveTree(dir_);
  }

  // The next event of `type`, skipping heartbeats; its frame is kept in last_.
  absl::Status Next(proto::WorkerEventBody type) {
    while (true) {
      absl::StatusOr<proto::ReceivedFrame> frame = control_->Receive(kAnswerTimeout);
      if (!frame.ok()) return frame.status();
      last_ = std::move(frame->payload);
      auto event = flatbuffers::GetRoot<proto::WorkerEvent>(last_.data());
      if (event->body_type() == proto::WorkerEventBody::Heartbeat) continue;
      if (event->body_type() != type) {
        return absl::InternalError(
            absl::StrCat("expected event ", proto::EnumNameWorkerEventBody(type), ", got ",
                         proto::EnumNameWorkerEventBody(event->body_type())));
      }
      return absl::OkStatus();
    }
  }
  const proto::WorkerEvent& LastEvent() const {
    return *flatbuffers::GetRoot<proto::WorkerEvent>(last_.data());
  }

  void Send(flatbuffers::FlatBufferBuilder& b, int fd = -1) {
    ASSERT_TRUE(control_->Send(b, fd).ok());
  }

  // The controller's side of a switch, done by hand: the weights into the arena under a fresh
  // epoch, LoadModel, Prepare.
  void LoadTinyCnn() {
    auto model = models::CreateModel("tiny_cnn");
    ASSERT_TRUE(model.ok()) << model.status();
    example_ = (*model)->ExampleInput(2, 7).input;
    absl::StatusOr<ModelWeights> weights = CollectWeights(**model, "tiny_cnn");
    ASSERT_TRUE(weights.ok()) << weights.status();
    absl::StatusOr<const memdaemon::StoredModel*> stored =
        daemon_->weights().Register(weights->bytes);
    ASSERT_TRUE(stored.ok()) << stored.status();
    const auto layers = static_cast<uint32_t>((*stored)->num_layers());
    absl::StatusOr<memdaemon::Lease> region =
        daemon_->leases().Acquire("weights", (*stored)->total_bytes());
    ASSERT_TRUE(region.ok()) << region.status();
    absl::StatusOr<grouping::GroupPlan> plan =
        grouping::EveryKPlan(static_cast<int>(layers), static_cast<int>(layers));
    ASSERT_TRUE(plan.ok());
    memdaemon::TransmitRequest request;
    request.model = *stored;
    request.groups = *plan;
    request.weights_offset = region->offset;
    auto sent = daemon_->transmitter().Start(std::move(request));
    ASSERT_TRUE(sent.ok()) << sent.status();
    ASSERT_TRUE((*sent)->Wait(kAnswerTimeout).ok());

    weights_offset_ = region->offset;
    weights_bytes_ = (*stored)->total_bytes();
    layers_ = layers;
    absl::StatusOr<ModelLayout> layout = LayoutOf(**model);
    ASSERT_TRUE(layout.ok()) << layout.status();
    layout_ = *std::move(layout);
    ASSERT_TRUE(Load("tiny").ok());
    epoch_ = (*sent)->epoch();
    Prepare("tiny");
  }

  // Gates model `name` (loaded over the fixture's weights) on their one group, its weights at
  // `offset` of the arena (the fixture's region when not given).
  void Prepare(const std::string& name, std::optional<uint64_t> offset = std::nullopt) {
    flatbuffers::FlatBufferBuilder prepare;
    const std::vector<uint32_t> last_layer = {layers_ - 1};
    proto::Finish(prepare, proto::CreateWorkerCommand(
                               prepare, 0, proto::WorkerCommandBody::Prepare,
                               proto::CreatePrepare(prepare, prepare.CreateString(name), epoch_, 0,
                                                    prepare.CreateVector(last_layer),
                                                    offset.value_or(weights_offset_))
                                   .Union()));
    Send(prepare);
  }

  // LoadModel of tiny_cnn's weights region as `name`, warmed as `warm` says (null: not at all);
  // the error it answered, or OK. Its ModelLoaded stays in last_.
  absl::Status Load(const std::string& name, const WarmSpec* warm = nullptr) {
    flatbuffers::FlatBufferBuilder load;
    auto warm_table = warm != nullptr ? proto::CreateWarmUp(load, warm->batch, warm->train,
                                                            warm->train_required, warm->measure)
                                      : 0;
    std::vector<flatbuffers::Offset<proto::LayoutLayer>> layers;
    for (const memdaemon::LayerSpec& layer : layout_.layers) {
      std::vector<std::string> names;
      std::vector<uint64_t> sizes;
      for (const memdaemon::TensorSpec& t : layer.tensors) {
        names.push_back(t.name);
        sizes.push_back(t.bytes);
      }
      layers.push_back(proto::CreateLayoutLayer(load, load.CreateString(layer.name),
                                                load.CreateVectorOfStrings(names),
                                                load.CreateVector(sizes)));
    }
    std::vector<uint32_t> train_order(layout_.train_order.begin(), layout_.train_order.end());
    proto::Finish(load, proto::CreateWorkerCommand(
                            load, 0, proto::WorkerCommandBody::LoadModel,
                            proto::CreateLoadModel(
                                load, load.CreateString(name), load.CreateString("tiny_cnn"),
                                weights_offset_, load.CreateVector(layers),
                                load.CreateVector(train_order), weights_bytes_, 0, warm_table)
                                .Union()));
    if (absl::Status sent = control_->Send(load); !sent.ok()) return sent;
    PSWITCH_RETURN_IF_ERROR(Next(proto::WorkerEventBody::ModelLoaded));
    const proto::ModelLoaded& loaded = *LastEvent().body_as_ModelLoaded();
    return loaded.error() == nullptr ? absl::OkStatus() : proto::FromWireError(loaded.error());
  }
  std::string WeightsBytes() {
    const std::byte* at = daemon_->arena().base() + weights_offset_;
    return std::string(reinterpret_cast<const char*>(at), weights_bytes_);
  }

  void MapRegion(uint64_t region, int fd, const std::string& cuda_ipc_handle = "") {
    flatbuffers::FlatBufferBuilder b;
    flatbuffers::Offset<flatbuffers::Vector<uint8_t>> handle = 0;
    if (!cuda_ipc_handle.empty()) {
      handle = b.CreateVector(reinterpret_cast<const uint8_t*>(cuda_ipc_handle.data()),
                              cuda_ipc_handle.size());
    }
    auto map = proto::CreateMapRegion(b, region, kRegionBytes, 0, handle, 0);
    proto::Finish(
        b, proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::MapRegion, map.Union()));
    Send(b, fd);
  }

  void UnmapRegion(uint64_t region) {
    flatbuffers::FlatBufferBuilder b;
    proto::Finish(b, proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::UnmapRegion,
                                                proto::CreateUnmapRegion(b, region).Union()));
    Send(b);
  }

  // One inference Run of `input`; outputs inline unless `outputs_to` is set.
  RunAnswer Run(const proto::HostTensor& input, const proto::ByteSlice* outputs_to = nullptr,
                const std::string& model_name = "tiny") {
    flatbuffers::FlatBufferBuilder b;
    auto inputs = proto::CreateWireTensors(b, {input});
    auto model = b.CreateString(model_name);
    proto::RunBuilder run(b);
    run.add_task_id(++task_);
    run.add_model(model);
    run.add_inputs(inputs);
    run.add_batch(2);
    run.add_iterations(1);
    const proto::Slice to =
        outputs_to != nullptr
            ? proto::Slice(outputs_to->region, outputs_to->offset, outputs_to->length)
            : proto::Slice();
    if (outputs_to != nullptr) run.add_outputs_to(&to);
    auto body = run.Finish();
    proto::Finish(b, proto::CreateWorkerCommand(b, 0, proto::WorkerCommandBody::Run, body.Union()));
    RunAnswer answer;
    if (!control_->Send(b).ok()) {
      answer.status = absl::InternalError("send failed");
      return answer;
    }
    if (absl::Status got = Next(proto::WorkerEventBody::RunDone); !got.ok()) {
      answer.status = got;
      return answer;
    }
    const proto::RunDone& done = *LastEvent().body_as_RunDone();
    EXPECT_EQ(done.task_id(), task_);
    if (done.error() != nullptr) {
      answer.status = absl::Status(static_cast<absl::StatusCode>(done.error()->code()),
                                   done.error()->message() ? done.error()->message()->str() : "");
      return answer;
    }
    absl::StatusOr<std::vector<proto::HostTensor>> outputs = proto::FromWireTensors(done.outputs());
    if (!outputs.ok()) {
      answer.status = outputs.status();
    } else {
      answer.outputs = std::move(*outputs);
    }
    return answer;
  }

  // `example_` as the framed path carries it, and as a Region tensor at `offset` of `segment`.
  proto::HostTensor InlineInput() const { return *ToHostTensor("input", example_); }
  proto::HostTensor RegionInput(ClientSegment& segment, uint64_t offset,
                                uint64_t region = kRegion) const {
    proto::HostTensor host = InlineInput();
    std::memcpy(segment.data() + offset, host.data.data(), host.data.size());
    host.place = proto::Place::Region;
    host.slice = proto::ByteSlice{region, offset, host.data.size()};
    host.data.clear();
    return host;
  }

  std::filesystem::path dir_;
  pid_t child_ = -1;
  std::unique_ptr<proto::FrameChannel> control_;
  std::unique_ptr<memdaemon::MemDaemon> daemon_;
  std::vector<uint8_t> last_;
  at::Tensor example_;
  uint64_t task_ = 0;
  uint64_t weights_offset_ = 0;
  uint64_t weights_bytes_ = 0;
  uint32_t layers_ = 0;
  ModelLayout layout_;
  uint32_t epoch_ = 0;
};

// A warm-up at the model's batch with a training step (BatchNorm running statistics, dropout,
// an SGD update) leaves every byte of the weights region as it was: the region may hold another
// model's weights by then. Measured steps come back for a fill job's admission.
TEST_F(WorkerRegionTest, AWarmUpWithATrainingStepWritesNothingInTheWeightsRegion) {
  const std::string before = WeightsBytes();
  RunAnswer cold = Run(InlineInput());
  ASSERT_TRUE(cold.status.ok()) << cold.status;
  WarmSpec warm;
  warm.batch = 4;
  warm.train = true;
  warm.train_required = true;
  warm.measure = true;
  ASSERT_TRUE(Load("warm", &warm).ok());
  const proto::ModelLoaded& loaded = *LastEvent().body_as_ModelLoaded();
  EXPECT_GT(loaded.infer_step_ns(), 0);
  EXPECT_GT(loaded.train_step_ns(), 0);
  EXPECT_EQ(loaded.train_warm_error(), nullptr);
  EXPECT_GE(loaded.warm_ns(), loaded.infer_step_ns() + loaded.train_step_ns());
  EXPECT_TRUE(WeightsBytes() == before) << "the warm-up wrote into the weights region";
  // The warmed model computes on the region's weights and statistics again (not on the scratch
  // copies its training step updated): it answers exactly as the unwarmed one did.
  Prepare("warm");
  RunAnswer warmed = Run(InlineInput(), nullptr, "warm");
  ASSERT_TRUE(warmed.status.ok()) << warmed.status;
  ASSERT_EQ(warmed.outputs.size(), 1u);
  EXPECT_EQ(warmed.outputs[0].data, cold.outputs[0].data);
  // Unmeasured, untrained: no step times.
  warm.train = false;
  warm.measure = false;
  ASSERT_TRUE(Load("warm-serving", &warm).ok());
  EXPECT_EQ(LastEvent().body_as_ModelLoaded()->infer_step_ns(), 0);
  EXPECT_EQ(LastEvent().body_as_ModelLoaded()->train_step_ns(), 0);
  EXPECT_TRUE(WeightsBytes() == before);
}

// Issue 29: the weights cache may put a model anywhere in the pool. Prepare names where: the
// worker's bound model follows (nothing rebuilt), reads only there, and an offset whose region
// would leave the arena is refused (the worker exits rather than compute out of bounds).
TEST_F(WorkerRegionTest, AModelFollowsItsWeightsWherePrepareSaysAndNeverOutsideTheArena) {
  RunAnswer before = Run(InlineInput());
  ASSERT_TRUE(before.status.ok()) << before.status;
  absl::StatusOr<memdaemon::Lease> moved = daemon_->leases().Acquire("moved", weights_bytes_);
  ASSERT_TRUE(moved.ok()) << moved.status();
  const std::string bytes = WeightsBytes();
  ASSERT_TRUE(daemon_->arena()
                  .CopyFromHost(moved->offset,
                                std::span<const std::byte>(
                                    reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()))
                  .ok());
  ASSERT_TRUE(daemon_->arena().Fill(weights_offset_, weights_bytes_, 0).ok());
  Prepare("tiny", moved->offset);
  RunAnswer after = Run(InlineInput());
  ASSERT_TRUE(after.status.ok()) << after.status;
  ASSERT_EQ(after.outputs.size(), before.outputs.size());
  EXPECT_EQ(after.outputs[0].data, before.outputs[0].data) << "the same weights, moved";
  Prepare("tiny", weights_offset_);  // back over the zeroed bytes: a different answer
  RunAnswer zeroed = Run(InlineInput());
  ASSERT_TRUE(zeroed.status.ok()) << zeroed.status;
  EXPECT_NE(zeroed.outputs[0].data, before.outputs[0].data);

  Prepare("tiny", daemon_->arena().size_bytes() - weights_bytes_ / 2);
  EXPECT_FALSE(Next(proto::WorkerEventBody::RunDone).ok()) << "the worker refused and exited";
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child_, &wstatus, 0), child_);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) != 0)
      << "a refused Prepare ends the worker with an error, status " << wstatus;
  child_ = -1;  // reaped here
}

TEST_F(WorkerRegionTest, AWarmUpBatchAboveTheMaximumFailsTheLoadAndLeavesNothingLoaded) {
  WarmSpec warm;
  warm.batch = kMaxWarmBatch + 1;
  absl::Status loaded = Load("too-big", &warm);
  EXPECT_EQ(loaded.code(), absl::StatusCode::kInvalidArgument) << loaded;
  EXPECT_THAT(loaded.message(), HasSubstr("warm-up batch"));
  RunAnswer run = Run(InlineInput(), nullptr, "too-big");
  EXPECT_EQ(run.status.code(), absl::StatusCode::kFailedPrecondition) << run.status;
  EXPECT_THAT(run.status.message(), HasSubstr("without load"));
}

TEST_F(WorkerRegionTest, RegionRunsMatchTheFramedPathAndAShrunkSegmentFailsOnlyItsTask) {
  // The framed baseline.
  RunAnswer framed = Run(InlineInput());
  ASSERT_TRUE(framed.status.ok()) << framed.status;
  ASSERT_EQ(framed.outputs.size(), 1u);
  ASSERT_EQ(framed.outputs[0].place, proto::Place::Inline);
  const std::vector<uint8_t>& expected = framed.outputs[0].data;

  ClientSegment segment;
  MapRegion(kRegion, segment.fd());

  // Inputs from the region, outputs into it: the same bytes as the framed path's.
  const proto::ByteSlice to{kRegion, kOutputsAt, 4096};
  std::memset(segment.data() + kOutputsAt, 0xee, 4096);
  RunAnswer mapped = Run(RegionInput(segment, 64), &to);
  ASSERT_TRUE(mapped.status.ok()) << mapped.status;
  ASSERT_EQ(mapped.outputs.size(), 1u);
  const proto::HostTensor& out = mapped.outputs[0];
  EXPECT_EQ(out.place, proto::Place::Region);
  EXPECT_EQ(out.slice, (proto::ByteSlice{kRegion, kOutputsAt, expected.size()}));
  EXPECT_EQ(out.shape, framed.outputs[0].shape);
  EXPECT_EQ(std::vector<uint8_t>(segment.data() + kOutputsAt,
                                 segment.data() + kOutputsAt + expected.size()),
            expected);
  EXPECT_EQ(segment.data()[kOutputsAt + expected.size()], 0xee);  // nothing past the outputs

  // The same from a sealed area (read in place, no guard).
  ClientSegment area(/*sealed=*/true);
  MapRegion(kRegion + 1, area.fd());
  const proto::ByteSlice in_area{kRegion + 1, kOutputsAt, 4096};
  RunAnswer from_area = Run(RegionInput(area, 128, kRegion + 1), &in_area);
  ASSERT_TRUE(from_area.status.ok()) << from_area.status;
  EXPECT_EQ(from_area.outputs[0].slice,
            (proto::ByteSlice{kRegion + 1, kOutputsAt, expected.size()}));
  EXPECT_EQ(
      std::vector<uint8_t>(area.data() + kOutputsAt, area.data() + kOutputsAt + expected.size()),
      expected);

  // Outputs that do not fit: the task fails, nothing is written.
  std::memset(segment.data() + kOutputsAt, 0xee, 4096);
  const proto::ByteSlice small{kRegion, kOutputsAt, expected.size() - 1};
  RunAnswer cramped = Run(RegionInput(segment, 64), &small);
  EXPECT_EQ(cramped.status.code(), absl::StatusCode::kResourceExhausted) << cramped.status;
  EXPECT_THAT(cramped.status.message(), HasSubstr(absl::StrCat("need ", expected.size())));
  EXPECT_EQ(segment.data()[kOutputsAt], 0xee);

  // The client truncates its segment: that task fails, naming the region...
  const proto::HostTensor input = RegionInput(segment, 64);
  segment.Resize(0);
  RunAnswer lost = Run(input, &to);
  EXPECT_EQ(lost.status.code(), absl::StatusCode::kDataLoss) << lost.status;
  EXPECT_THAT(lost.status.message(), HasSubstr("region 11"));
  // ...and the worker serves on: the framed path, then the region once the client restored it.
  RunAnswer after = Run(InlineInput());
  ASSERT_TRUE(after.status.ok()) << after.status;
  EXPECT_EQ(after.outputs[0].data, expected);
  segment.Resize(kRegionBytes);
  RunAnswer restored = Run(RegionInput(segment, 64), &to);
  ASSERT_TRUE(restored.status.ok()) << restored.status;
  EXPECT_EQ(std::vector<uint8_t>(segment.data() + kOutputsAt,
                                 segment.data() + kOutputsAt + expected.size()),
            expected);
}

TEST_F(WorkerRegionTest, HostileSlicesAndUnmappedRegionsAreRefusedPerTask) {
  ClientSegment segment;
  MapRegion(kRegion, segment.fd());
  proto::HostTensor past = RegionInput(segment, 0);
  past.slice.offset = kRegionBytes - past.slice.length + 4;
  RunAnswer answer = Run(past);
  EXPECT_EQ(answer.status.code(), absl::StatusCode::kOutOfRange) << answer.status;
  EXPECT_THAT(answer.status.message(), HasSubstr("region 11"));

  const proto::ByteSlice outside{kRegion, kRegionBytes - 16, 64};
  answer = Run(RegionInput(segment, 0), &outside);
  EXPECT_EQ(answer.status.code(), absl::StatusCode::kOutOfRange) << answer.status;

  answer = Run(RegionInput(segment, 0, /*region=*/12));
  EXPECT_EQ(answer.status.code(), absl::StatusCode::kNotFound) << answer.status;

  // A CUDA IPC handle on the host backend: a RegionMapFailed event naming the region and why (so
  // pswitchd maps it again before the next Run), and the region stays unmapped.
  MapRegion(13, -1, std::string(64, 'h'));
  ASSERT_TRUE(Next(proto::WorkerEventBody::RegionMapFailed).ok());
  EXPECT_EQ(LastEvent().body_as_RegionMapFailed()->region(), 13u);
  EXPECT_THAT(LastEvent().body_as_RegionMapFailed()->error()->message()->str(),
              HasSubstr("CUDA backend"));
  answer = Run(RegionInput(segment, 0, /*region=*/13));
  EXPECT_EQ(answer.status.code(), absl::StatusCode::kNotFound) << answer.status;

  UnmapRegion(kRegion);
  answer = Run(RegionInput(segment, 0));
  EXPECT_EQ(answer.status.code(), absl::StatusCode::kNotFound) << answer.status;
  EXPECT_TRUE(Run(InlineInput()).status.ok());
}

}  // namespace
}  // namespace pswitch::worker
