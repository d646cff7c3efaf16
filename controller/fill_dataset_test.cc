// A fill job's dataset: pswitchd's own sealed copy, parsed within the limits, with the "input"
// rows described as a slice a worker can map; hostile files are refused, never crash anything.
#include "controller/fill_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "base/files.h"
#include "controller/worker_commands.h"
#include "gtest/gtest.h"
#include "models/safetensors.h"
#include "proto/framing.h"
#include "proto/worker_generated.h"

namespace pswitch::controller {

using registry::CatalogEntry;
using registry::TensorSpec;

namespace {

class FillDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pswitch-fill-dataset-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)base::RemoveTree(dir_); }

  // A safetensors file with a "labels" tensor before "input" (so "input" is not at the data
  // section's start) and `rows` rows of 3 floats.
  std::string WriteDataset(const std::string& name, int64_t rows,
                           models::DType dtype = models::DType::kF32) {
    labels_.assign(5, 7);
    values_.resize(static_cast<size_t>(rows) * 3);
    for (size_t i = 0; i < values_.size(); ++i) values_[i] = static_cast<float>(i) + 0.5f;
    const size_t element = dtype == models::DType::kF64 ? 8 : 4;
    std::vector<uint8_t> raw(values_.size() * element);
    std::memcpy(raw.data(), values_.data(), std::min(raw.size(), values_.size() * 4));
    auto bytes = models::SerializeSafetensors(
        {models::SafetensorsEntry{"labels", models::DType::kI64, {5}, labels_.data(), 40},
         models::SafetensorsEntry{"input", dtype, {rows, 3}, raw.data(), raw.size()}});
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return WriteRaw(name, *bytes);
  }
  std::string WriteRaw(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  static UniqueFd Open(const std::string& path, int flags = O_RDONLY) {
    return UniqueFd(::open(path.c_str(), flags | O_CLOEXEC));
  }

  std::string dir_;
  std::vector<int64_t> labels_;
  std::vector<float> values_;
};

TEST_F(FillDatasetTest, TheRowsAreASliceOfPswitchdsSealedCopy) {
  const std::string path = WriteDataset("rows.safetensors", 4);
  UniqueFd fd = Open(path);
  auto dataset = LoadFillDataset(fd.get(), "rows.safetensors", 1 << 20);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  const FillDataset& d = **dataset;
  EXPECT_EQ(d.num_rows, 4);
  EXPECT_EQ(d.rows.dtype, proto::DType::F32);
  EXPECT_EQ(d.rows.shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(d.rows.place, proto::Place::Region);
  EXPECT_EQ(d.rows.slice.region, d.region->id());
  EXPECT_EQ(d.rows.slice.length, 4u * 3 * 4);
  // The client's file changes after the load: the copy, and so the rows, do not.
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  const auto* base = static_cast<const uint8_t*>(
      ::mmap(nullptr, d.region->bytes(), PROT_READ, MAP_SHARED, d.region->fd(), 0));
  ASSERT_NE(base, MAP_FAILED);
  EXPECT_EQ(std::memcmp(base + d.rows.slice.offset, values_.data(), d.rows.slice.length), 0);
  ::munmap(const_cast<uint8_t*>(base), d.region->bytes());
  // A worker is handed the region with the Run, the rows as their slice only.
  TaskSpec spec;
  spec.model = "fill-1";
  spec.regions.push_back(d.region);
  FillRunSpec fill;
  fill.dataset = d.rows;
  spec.fill = fill;
  EXPECT_TRUE(CheckRegionSlices(spec).ok());
  flatbuffers::FlatBufferBuilder b;
  BuildRun(b, 1, spec, 2, RunState{});
  const auto* run = flatbuffers::GetRoot<proto::WorkerCommand>(b.GetBufferPointer())->body_as_Run();
  ASSERT_NE(run->fill()->dataset(), nullptr);
  EXPECT_EQ(run->fill()->dataset()->slice()->region(), d.region->id());
  EXPECT_EQ(run->fill()->dataset()->slice()->offset(), d.rows.slice.offset);
  EXPECT_EQ(run->fill()->dataset()->data(), nullptr);  // no bytes in the message
  spec.regions.clear();
  EXPECT_EQ(CheckRegionSlices(spec).code(), absl::StatusCode::kInternal);
}

TEST_F(FillDatasetTest, HostileFilesAreRefused) {
  auto refused = [&](int fd, uint64_t max_bytes = 1 << 20) {
    return LoadFillDataset(fd, "the dataset", max_bytes).status().code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  // Not regular files: a directory, a pipe, a socket.
  UniqueFd dir = Open(dir_, O_RDONLY | O_DIRECTORY);
  EXPECT_EQ(refused(dir.get()), kInvalid);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  UniqueFd pipe_read(pipe_fds[0]), pipe_write(pipe_fds[1]);
  EXPECT_EQ(refused(pipe_read.get()), kInvalid);
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  UniqueFd one(pair[0]), two(pair[1]);
  EXPECT_EQ(refused(one.get()), kInvalid);
  // Over --max-dataset-bytes.
  const std::string good = WriteDataset("good.safetensors", 64);
  UniqueFd good_fd = Open(good);
  EXPECT_EQ(refused(good_fd.get(), 100), kInvalid);
  // Not safetensors; a header length past the end; no "input"; no rows; a dtype models lack.
  UniqueFd garbage = Open(WriteRaw("garbage", std::string(64, '\xff')));
  EXPECT_EQ(refused(garbage.get()), kInvalid);
  UniqueFd tiny = Open(WriteRaw("tiny", "abc"));
  EXPECT_EQ(refused(tiny.get()), kInvalid);
  float one_float = 1;
  auto other = models::SerializeSafetensors(
      {models::SafetensorsEntry{"rows", models::DType::kF32, {1}, &one_float, 4}});
  ASSERT_TRUE(other.ok());
  UniqueFd no_input = Open(WriteRaw("no-input", *other));
  EXPECT_EQ(refused(no_input.get()), kInvalid);
  auto empty = models::SerializeSafetensors(
      {models::SafetensorsEntry{"input", models::DType::kF32, {0, 3}, nullptr, 0}});
  ASSERT_TRUE(empty.ok());
  UniqueFd no_rows = Open(WriteRaw("no-rows", *empty));
  EXPECT_EQ(refused(no_rows.get()), kInvalid);
  UniqueFd f64 = Open(WriteDataset("f64.safetensors", 2, models::DType::kF64));
  EXPECT_EQ(refused(f64.get()), kInvalid);
  // Opened for writing only: not the client's to read.
  UniqueFd write_only = Open(good, O_WRONLY);
  EXPECT_EQ(refused(write_only.get()), kInvalid);
}

TEST_F(FillDatasetTest, AFileTruncatedAfterPassingIsRefusedOrCopiedWhole) {
  const std::string path = WriteDataset("rows.safetensors", 1000);
  UniqueFd fd = Open(path);
  // Truncated before pswitchd copies it: what is left is a truncated safetensors file.
  ASSERT_EQ(::truncate(path.c_str(), 200), 0);
  absl::StatusOr<std::shared_ptr<const FillDataset>> cut =
      LoadFillDataset(fd.get(), "rows", 1 << 20);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument) << cut.status();
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  EXPECT_EQ(LoadFillDataset(fd.get(), "rows", 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(FillDatasetTest, RowsMustFitTheModelsInput) {
  UniqueFd fd = Open(WriteDataset("rows.safetensors", 2));
  auto dataset = LoadFillDataset(fd.get(), "rows", 1 << 20);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  CatalogEntry model;
  model.request.name = "mlp";
  model.input = TensorSpec{"input", proto::DType::F32, {-1, 3}};
  EXPECT_TRUE(CheckDatasetFitsModel(**dataset, model).ok());
  model.input.shape = {-1, 4};
  absl::Status wide = CheckDatasetFitsModel(**dataset, model);
  EXPECT_EQ(wide.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wide.message().find("mlp"), absl::string_view::npos) << wide;
  model.input.shape = {-1, 3, 1};
  EXPECT_EQ(CheckDatasetFitsModel(**dataset, model).code(), absl::StatusCode::kInvalidArgument);
  model.input = TensorSpec{"input", proto::DType::I64, {-1, 3}};
  EXPECT_EQ(CheckDatasetFitsModel(**dataset, model).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(FillDatasetTest, TheOutputIsWrittenFromTheStartAndTruncatedThere) {
  const std::string path = WriteRaw("out", std::string(100, 'z'));
  UniqueFd fd = Open(path, O_WRONLY);
  ASSERT_EQ(::lseek(fd.get(), 50, SEEK_SET), 50);
  ASSERT_TRUE(WriteOutputFile(fd.get(), "output bytes", "the output").ok());
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "output bytes");
  UniqueFd read_only = Open(path, O_RDONLY);
  EXPECT_FALSE(WriteOutputFile(read_only.get(), "x", "the output").ok());
}

}  // namespace
}  // namespace pswitch::controller
