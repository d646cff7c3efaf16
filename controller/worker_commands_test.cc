#include "controller/worker_commands.h"

#include <sys/mman.h>
#include <unistd.h>

#include "gtest/gtest.h"
#include "proto/framing.h"
#include "proto/worker_generated.h"

namespace pswitch::controller {
namespace {

using dataplane::TransferRegion;

proto::HostTensor RegionTensor(const std::string& name, uint64_t region, uint64_t offset,
                               int64_t elements) {
  proto::HostTensor t;
  t.name = name;
  t.dtype = proto::DType::F32;
  t.shape = {elements};
  t.place = proto::Place::Region;
  t.slice = {region, offset, static_cast<uint64_t>(elements) * 4};
  return t;
}

std::shared_ptr<const TransferRegion> Staging(uint64_t bytes) {
  auto region = TransferRegion::NewStaging(bytes, "alice");
  EXPECT_TRUE(region.ok()) << region.status();
  return *region;
}

// The Run carries descriptors only: a Region input is its slice with no bytes, and the output
// space is Run.outputs_to.
TEST(WorkerCommandsTest, ARunCarriesSlicesAndTheOutputSpaceNotBytes) {
  auto region = Staging(1 << 20);
  TaskSpec spec;
  spec.model = "m";
  spec.regions = {region};
  spec.inputs = {RegionTensor("x", region->id(), 4096, 1000)};
  spec.outputs_to = proto::ByteSlice{region->id(), 65536, 8192};
  flatbuffers::FlatBufferBuilder b;
  BuildRun(b, 9, spec, 1, RunState());
  auto command = proto::VerifyPayload<proto::WorkerCommand>(
      std::span<const uint8_t>(b.GetBufferPointer(), b.GetSize()), "command");
  ASSERT_TRUE(command.ok());
  const proto::Run* run = (*command)->body_as_Run();
  ASSERT_NE(run, nullptr);
  ASSERT_EQ(run->inputs()->size(), 1u);
  const proto::Tensor* x = run->inputs()->Get(0);
  EXPECT_EQ(x->place(), proto::Place::Region);
  EXPECT_TRUE(x->data() == nullptr || x->data()->size() == 0);
  EXPECT_EQ(x->slice()->region(), region->id());
  EXPECT_EQ(x->slice()->offset(), 4096u);
  EXPECT_EQ(x->slice()->length(), 4000u);
  ASSERT_NE(run->outputs_to(), nullptr);
  EXPECT_EQ(run->outputs_to()->region(), region->id());
  EXPECT_EQ(run->outputs_to()->offset(), 65536u);
  EXPECT_EQ(run->outputs_to()->length(), 8192u);
  EXPECT_LT(b.GetSize(), 1024u);  // no tensor bytes in it

  TaskSpec inline_outputs = spec;
  inline_outputs.outputs_to.reset();
  flatbuffers::FlatBufferBuilder b2;
  BuildRun(b2, 9, inline_outputs, 1, RunState());
  EXPECT_EQ(flatbuffers::GetRoot<proto::WorkerCommand>(b2.GetBufferPointer())
                ->body_as_Run()
                ->outputs_to(),
            nullptr);
}

TEST(WorkerCommandsTest, MapRegionNamesTheRegionAndUnmapRegionItsId) {
  auto region = Staging(8192);
  flatbuffers::FlatBufferBuilder b;
  BuildMapRegion(b, *region);
  auto* map = flatbuffers::GetRoot<proto::WorkerCommand>(b.GetBufferPointer())->body_as_MapRegion();
  ASSERT_NE(map, nullptr);
  EXPECT_EQ(map->region(), region->id());
  EXPECT_EQ(map->bytes(), 8192u);
  EXPECT_EQ(map->file_offset(), 0u);
  EXPECT_TRUE(map->cuda_ipc_handle() == nullptr);
  auto cuda = TransferRegion::FromCudaIpc(std::string(64, 'h'), 1, 4096, "alice");
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  flatbuffers::FlatBufferBuilder c;
  BuildMapRegion(c, **cuda);
  auto* cmap =
      flatbuffers::GetRoot<proto::WorkerCommand>(c.GetBufferPointer())->body_as_MapRegion();
  ASSERT_NE(cmap->cuda_ipc_handle(), nullptr);
  EXPECT_EQ(cmap->cuda_ipc_handle()->size(), 64u);
  EXPECT_EQ(cmap->device(), 1);
  flatbuffers::FlatBufferBuilder u;
  BuildUnmapRegion(u, 42);
  EXPECT_EQ(flatbuffers::GetRoot<proto::WorkerCommand>(u.GetBufferPointer())
                ->body_as_UnmapRegion()
                ->region(),
            42u);
}

// A shared-memory file that shrank after admission: the task fails OutOfRange at send time.
TEST(WorkerCommandsTest, ASliceOfAShrunkFileIsRefusedAtSend) {
  UniqueFd file(::memfd_create("shm-test", MFD_CLOEXEC));
  ASSERT_TRUE(file.valid());
  ASSERT_EQ(::ftruncate(file.get(), 1 << 20), 0);
  UniqueFd ours(::dup(file.get()));
  auto region = TransferRegion::FromShmFile(std::move(ours), 0, 1 << 20, "alice");
  ASSERT_TRUE(region.ok()) << region.status();
  TaskSpec spec;
  spec.regions = {*region};
  spec.inputs = {RegionTensor("x", (*region)->id(), 512 << 10, 1024)};
  EXPECT_TRUE(CheckRegionSlices(spec).ok());
  // Its owner truncates it under the task.
  ASSERT_EQ(::ftruncate(file.get(), 256 << 10), 0);
  absl::Status refused = CheckRegionSlices(spec);
  EXPECT_EQ(refused.code(), absl::StatusCode::kOutOfRange) << refused;
  EXPECT_NE(refused.message().find("input 'x'"), absl::string_view::npos) << refused;
  EXPECT_NE(refused.message().find("shrank"), absl::string_view::npos) << refused;
  // The output space is checked the same way.
  spec.inputs.clear();
  spec.outputs_to = proto::ByteSlice{(*region)->id(), 300 << 10, 4096};
  EXPECT_EQ(CheckRegionSlices(spec).code(), absl::StatusCode::kOutOfRange);
  spec.outputs_to = proto::ByteSlice{(*region)->id(), 0, 4096};
  EXPECT_TRUE(CheckRegionSlices(spec).ok());
}

TEST(WorkerCommandsTest, ASliceOfARegionTheTaskDoesNotHoldIsRefused) {
  auto held = Staging(4096);
  auto other = Staging(4096);
  TaskSpec spec;
  spec.regions = {held};
  spec.inputs = {RegionTensor("x", other->id(), 0, 16)};
  EXPECT_EQ(CheckRegionSlices(spec).code(), absl::StatusCode::kInternal);
  spec.inputs = {RegionTensor("x", held->id(), 4000, 100)};  // past the end
  EXPECT_EQ(CheckRegionSlices(spec).code(), absl::StatusCode::kOutOfRange);
  spec.inputs[0].place = proto::Place::Payload;
  EXPECT_EQ(CheckRegionSlices(spec).code(), absl::StatusCode::kInternal);
}

TEST(WorkerCommandsTest, OutputsOutsideTheOutputSpaceAreRefused) {
  const proto::ByteSlice space{7, 4096, 8192};
  std::vector<proto::HostTensor> outputs = {RegionTensor("y", 7, 4096, 1024),
                                            RegionTensor("z", 7, 8192, 1024)};
  EXPECT_TRUE(CheckRunOutputs(outputs, space).ok());
  proto::HostTensor inline_output;
  inline_output.name = "inline";
  inline_output.shape = {1};
  inline_output.data = {0, 0, 0, 0};
  EXPECT_TRUE(CheckRunOutputs({inline_output}, space).ok());
  EXPECT_TRUE(CheckRunOutputs({inline_output}, std::nullopt).ok());

  auto refused = [&](proto::HostTensor t, std::optional<proto::ByteSlice> to) {
    absl::Status s = CheckRunOutputs({t}, to);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << t.slice.offset;
    EXPECT_NE(s.message().find("worker wrote outputs outside"), absl::string_view::npos) << s;
  };
  refused(RegionTensor("y", 8, 4096, 16), space);       // another region
  refused(RegionTensor("y", 7, 0, 16), space);          // before the space
  refused(RegionTensor("y", 7, 12288 - 8, 16), space);  // past its end
  proto::HostTensor wraps = RegionTensor("y", 7, 0, 16);
  wraps.slice = {7, UINT64_MAX - 8, 64};  // offset + length overflows
  refused(wraps, space);
  refused(RegionTensor("y", 7, 4096, 16), std::nullopt);  // the task named no space
  proto::HostTensor payload = RegionTensor("y", 0, 0, 16);
  payload.place = proto::Place::Payload;
  refused(payload, space);
}

}  // namespace
}  // namespace pswitch::controller
