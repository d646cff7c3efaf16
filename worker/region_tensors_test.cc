// Task inputs read from, and outputs written into, mapped transfer regions (host backend).
#include <fcntl.h>
#include <sys/mman.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/host_tensors.h"
#include "worker/region_map.h"

namespace pswitch::worker {
namespace {

using ::testing::HasSubstr;

const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));

// A memory file the test writes and shrinks from its own mapping, as a client would.
class ClientFile {
 public:
  ClientFile(uint64_t bytes, bool sealed) : bytes_(bytes) {
    fd_.Reset(::memfd_create("region-tensors-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    EXPECT_EQ(::ftruncate(fd_.get(), static_cast<off_t>(bytes)), 0);
    if (sealed) {
      EXPECT_EQ(::fcntl(fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    EXPECT_NE(p, MAP_FAILED);
    data_ = static_cast<uint8_t*>(p);
  }
  ~ClientFile() { ::munmap(data_, bytes_); }
  uint8_t* data() { return data_; }
  UniqueFd Pass() const { return UniqueFd(::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0)); }
  void Resize(uint64_t bytes) { ASSERT_EQ(::ftruncate(fd_.get(), static_cast<off_t>(bytes)), 0); }

 private:
  const uint64_t bytes_;
  UniqueFd fd_;
  uint8_t* data_ = nullptr;
};

RegionSpec Spec(uint64_t region, uint64_t bytes) {
  RegionSpec spec;
  spec.region = region;
  spec.bytes = bytes;
  return spec;
}

proto::HostTensor InlineOf(const std::string& name, const at::Tensor& t) {
  absl::StatusOr<proto::HostTensor> host = ToHostTensor(name, t);
  EXPECT_TRUE(host.ok()) << host.status();
  return *host;
}

// `t`'s bytes written at `offset` of `file`, and the Place::Region tensor naming them.
proto::HostTensor PlaceIn(ClientFile& file, uint64_t region, uint64_t offset,
                          const std::string& name, const at::Tensor& t) {
  proto::HostTensor host = InlineOf(name, t);
  std::memcpy(file.data() + offset, host.data.data(), host.data.size());
  host.place = proto::Place::Region;
  host.slice = proto::ByteSlice{region, offset, host.data.size()};
  host.data.clear();
  return host;
}

std::vector<uint8_t> BytesOf(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

const c10::Device kCpu(c10::kCPU);

// A model's input as a client sends it, and back: only the tensors it has, under their names.
TEST(RegionTensorsTest, AModelInputBecomesNamedHostTensorsAndBack) {
  models::ModelInput input;
  input.input = torch::arange(6, torch::kInt64).reshape({2, 3});
  input.attention_mask = torch::ones({2, 3}, torch::kInt64);
  absl::StatusOr<std::vector<proto::HostTensor>> host = ToHostTensors(input);
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_EQ(host->size(), 2u) << "no token_type_ids: none sent";
  EXPECT_EQ((*host)[0].name, "input");
  EXPECT_EQ((*host)[1].name, "attention_mask");
  absl::StatusOr<models::ModelInput> back = ToModelInput(*host);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(torch::equal(back->input, input.input));
  EXPECT_TRUE(torch::equal(back->attention_mask, input.attention_mask));
  EXPECT_FALSE(back->token_type_ids.defined());
}

TEST(RegionTensorsTest, InputsFromARegionEqualInlineInputsBitForBit) {
  for (bool sealed : {true, false}) {
    SCOPED_TRACE(sealed ? "sealed area" : "shared-memory file");
    ClientFile file(4 * kPage, sealed);
    RegionMap regions(&HostRegionDevice());
    ASSERT_TRUE(regions.Map(Spec(3, 4 * kPage), file.Pass()).ok());
    torch::manual_seed(7);
    // NaNs and negative zeroes included: equality is of bytes, not of values.
    at::Tensor images = torch::randn({2, 3, 8, 8});
    images.view(-1)[5].fill_(std::numeric_limits<float>::quiet_NaN());
    images.view(-1)[6].fill_(-0.0f);
    at::Tensor mask = torch::randint(0, 2, {2, 16}, torch::kLong);

    std::vector<proto::HostTensor> inline_inputs = {InlineOf("input", images),
                                                    InlineOf("attention_mask", mask)};
    std::vector<proto::HostTensor> region_inputs = {
        PlaceIn(file, 3, 64, "input", images), PlaceIn(file, 3, 3 * kPage, "attention_mask", mask)};
    absl::StatusOr<models::ModelInput> framed = TaskInputOn(inline_inputs, regions, kCpu);
    absl::StatusOr<models::ModelInput> mapped = TaskInputOn(region_inputs, regions, kCpu);
    ASSERT_TRUE(framed.ok()) << framed.status();
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    EXPECT_EQ(BytesOf(mapped->input), BytesOf(framed->input));
    EXPECT_EQ(BytesOf(mapped->attention_mask), BytesOf(framed->attention_mask));
    EXPECT_EQ(mapped->input.sizes(), images.sizes());
    EXPECT_EQ(mapped->attention_mask.scalar_type(), torch::kLong);

    // The task owns its copy: the client rewriting the region mid-compute changes nothing.
    std::memset(file.data(), 0x7f, 4 * kPage);
    EXPECT_EQ(BytesOf(mapped->input), BytesOf(images));
  }
}

TEST(RegionTensorsTest, SlicesTheWorkerHasNotMappedAreRefused) {
  ClientFile file(kPage, true);
  RegionMap regions(&HostRegionDevice());
  ASSERT_TRUE(regions.Map(Spec(3, kPage), file.Pass()).ok());
  at::Tensor t = torch::ones({16});  // 64 bytes

  proto::HostTensor past = PlaceIn(file, 3, 0, "input", t);
  past.slice.offset = kPage - 32;
  absl::Status status = TaskInputOn({past}, regions, kCpu).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(status.message(), HasSubstr("region 3"));

  proto::HostTensor wrapping = PlaceIn(file, 3, 0, "input", t);
  wrapping.slice.offset = UINT64_MAX - 8;  // offset + length overflows
  EXPECT_EQ(TaskInputOn({wrapping}, regions, kCpu).status().code(),
            absl::StatusCode::kInvalidArgument);

  proto::HostTensor unmapped = PlaceIn(file, 3, 0, "input", t);
  unmapped.slice.region = 4;
  status = TaskInputOn({unmapped}, regions, kCpu).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("region 4 is not mapped"));

  proto::HostTensor short_slice = PlaceIn(file, 3, 0, "input", t);
  short_slice.slice.length = 60;  // shape [16] of f32 needs 64
  status = TaskInputOn({short_slice}, regions, kCpu).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("needs 64 bytes"));

  proto::HostTensor payload = PlaceIn(file, 3, 0, "input", t);
  payload.place = proto::Place::Payload;
  payload.slice.region = 0;
  EXPECT_EQ(TaskInputOn({payload}, regions, kCpu).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A client that truncates its shared-memory file fails its own task; the next task runs.
TEST(RegionTensorsTest, AShrunkFileFailsThatTaskOnlyAndTheNextOneRuns) {
  ClientFile file(4 * kPage, /*sealed=*/false);
  RegionMap regions(&HostRegionDevice());
  ASSERT_TRUE(regions.Map(Spec(5, 4 * kPage), file.Pass()).ok());
  at::Tensor t = torch::arange(static_cast<int64_t>(kPage), torch::kFloat);  // 4 pages
  proto::HostTensor input = PlaceIn(file, 5, 0, "input", t);
  file.Resize(kPage);

  absl::Status lost = TaskInputOn({input}, regions, kCpu).status();
  EXPECT_EQ(lost.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(lost.message(), HasSubstr("region 5"));

  // Another task on what is still there, then the same one once the client restored the file.
  at::Tensor small = torch::full({8}, 2.5f);
  absl::StatusOr<models::ModelInput> next =
      TaskInputOn({PlaceIn(file, 5, 0, "input", small)}, regions, kCpu);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(torch::equal(next->input, small));
  file.Resize(4 * kPage);
  input = PlaceIn(file, 5, 0, "input", t);
  absl::StatusOr<models::ModelInput> again = TaskInputOn({input}, regions, kCpu);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(torch::equal(again->input, t));
}

TEST(RegionTensorsTest, OutputsArePackedAt64ByteOffsetsInsideTheSlice) {
  ClientFile file(kPage, true);
  std::memset(file.data(), 0xee, kPage);
  RegionMap regions(&HostRegionDevice());
  ASSERT_TRUE(regions.Map(Spec(2, kPage), file.Pass()).ok());
  at::Tensor logits = torch::randn({2, 3});              // 24 bytes at 0
  at::Tensor ids = torch::arange(5, torch::kLong) * 11;  // 40 bytes at 64
  const proto::ByteSlice to{2, 100, 200};
  absl::StatusOr<std::vector<proto::HostTensor>> written =
      WriteOutputsToRegion({{"output", logits}, {"ids", ids}}, to, regions);
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_EQ(written->size(), 2u);
  const proto::HostTensor& first = (*written)[0];
  const proto::HostTensor& second = (*written)[1];
  EXPECT_EQ(first.name, "output");
  EXPECT_EQ(first.place, proto::Place::Region);
  EXPECT_EQ(first.slice, (proto::ByteSlice{2, 100, 24}));
  EXPECT_EQ(first.dtype, proto::DType::F32);
  EXPECT_EQ(first.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(first.data.empty());
  EXPECT_EQ(second.slice, (proto::ByteSlice{2, 164, 40}));
  EXPECT_EQ(second.dtype, proto::DType::I64);
  EXPECT_TRUE(proto::ValidateHostTensor(first).ok());
  EXPECT_EQ(std::vector<uint8_t>(file.data() + 100, file.data() + 124), BytesOf(logits));
  EXPECT_EQ(std::vector<uint8_t>(file.data() + 164, file.data() + 204), BytesOf(ids));
  // Nothing outside the outputs' bytes was touched: not before the slice, not the padding,
  // not after.
  EXPECT_EQ(file.data()[99], 0xee);
  EXPECT_EQ(file.data()[124], 0xee);
  EXPECT_EQ(file.data()[163], 0xee);
  EXPECT_EQ(file.data()[204], 0xee);

  // And they read back as inputs, as a client hands an output to its next request.
  absl::StatusOr<models::ModelInput> back = TaskInputOn(
      {proto::HostTensor{"input", first.dtype, first.shape, {}, first.place, first.slice}}, regions,
      kCpu);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(BytesOf(back->input), BytesOf(logits));
}

TEST(RegionTensorsTest, OutputsThatDoNotFitFailAndWriteNothing) {
  ClientFile file(kPage, true);
  std::memset(file.data(), 0xee, kPage);
  RegionMap regions(&HostRegionDevice());
  ASSERT_TRUE(regions.Map(Spec(2, kPage), file.Pass()).ok());
  // 24 bytes, then 40 at 64: 104 needed, 103 given.
  absl::Status status = WriteOutputsToRegion({{"output", torch::zeros({2, 3})},
                                              {"ids", torch::zeros({5}, torch::kLong)}},
                                             {2, 0, 103}, regions)
                            .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("need 104 bytes but outputs_to holds 103"));
  for (uint64_t i = 0; i < kPage; ++i) ASSERT_EQ(file.data()[i], 0xee) << i;

  EXPECT_EQ(WriteOutputsToRegion({{"output", torch::zeros({2})}}, {2, kPage - 4, 8}, regions)
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(
      WriteOutputsToRegion({{"output", torch::zeros({2})}}, {9, 0, 8}, regions).status().code(),
      absl::StatusCode::kNotFound);
}

TEST(RegionTensorsTest, OutputsIntoAShrunkFileFailCleanly) {
  ClientFile file(2 * kPage, /*sealed=*/false);
  RegionMap regions(&HostRegionDevice());
  ASSERT_TRUE(regions.Map(Spec(4, 2 * kPage), file.Pass()).ok());
  file.Resize(0);
  absl::Status status =
      WriteOutputsToRegion({{"output", torch::ones({64})}}, {4, kPage, 256}, regions).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("output 'output' in region 4"));
}

TEST(RegionTensorsTest, OutputsIntoAReadOnlyMappingAreRefused) {
  ClientFile file(kPage, true);
  UniqueFd writable = file.Pass();
  UniqueFd read_only(
      ::open(("/proc/self/fd/" + std::to_string(writable.get())).c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(read_only.valid());
  RegionMap regions(&HostRegionDevice());
  ASSERT_TRUE(regions.Map(Spec(6, kPage), std::move(read_only)).ok());
  EXPECT_EQ(
      WriteOutputsToRegion({{"output", torch::ones({4})}}, {6, 0, 64}, regions).status().code(),
      absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace pswitch::worker
