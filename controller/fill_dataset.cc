#include "controller/fill_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status.h"
#include "models/safetensors.h"
#include "proto/dtype.h"

namespace pswitch::controller {

using registry::CatalogEntry;
using registry::TensorSpec;

absl::StatusOr<std::shared_ptr<const FillDataset>> LoadFillDataset(int source,
                                                                   absl::string_view name,
                                                                   uint64_t max_bytes) {
  const std::string what = absl::StrCat("dataset ", name);
  // The copy runs on the fill manager's one I/O thread: a read that never returns there would
  // hold every fill job's file work.
  PSWITCH_RETURN_IF_ERROR(base::CheckLocalFile(source, what));
  PSWITCH_ASSIGN_OR_RETURN(UniqueFd copy, base::SealedCopyOfFile(source, what, max_bytes));
  models::SafetensorsLimits limits;
  limits.max_file_bytes = max_bytes;
  // The parse needs the bytes in hand; they go again before this returns (the copy stays).
  uint64_t file_bytes = 0;
  auto dataset = std::make_shared<FillDataset>();
  {
    PSWITCH_ASSIGN_OR_RETURN(std::string bytes,
                             base::ReadSealedMemoryFile(copy, what, limits.max_file_bytes));
    file_bytes = bytes.size();
    PSWITCH_ASSIGN_OR_RETURN(models::SafetensorsFile file,
                             models::SafetensorsFile::Parse(std::move(bytes), name, limits));
    const models::SafetensorsTensor* input = file.Find("input");
    if (input == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, " has no 'input' tensor"));
    }
    if (input->shape.empty() || input->shape[0] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": 'input' needs at least one row"));
    }
    const proto::DTypeInfo* dtype = proto::DTypeByName(models::DTypeName(input->dtype));
    if (dtype == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": 'input' is ", models::DTypeName(input->dtype), ", which models do not take"));
    }
    // Where "input" lies in the file: the data section follows the 8-byte length and the
    // header, and Parse checked that its tensors (in data order) cover it without holes.
    uint64_t before = 0;
    for (const models::SafetensorsTensor& t : file.tensors()) {
      if (&t == input) break;
      before += t.bytes;
    }
    uint64_t data_bytes = 0;
    for (const models::SafetensorsTensor& t : file.tensors()) data_bytes += t.bytes;
    const uint64_t data_begin = file_bytes - data_bytes;
    dataset->rows.name = "input";
    dataset->rows.dtype = dtype->wire;
    dataset->rows.shape = input->shape;
    dataset->rows.place = proto::Place::Region;
    dataset->rows.slice.offset = data_begin + before;
    dataset->rows.slice.length = input->bytes;
    dataset->num_rows = input->shape[0];
  }
  PSWITCH_ASSIGN_OR_RETURN(dataset->region, dataplane::TransferRegion::FromSealedMemfd(
                                                std::move(copy), file_bytes, "fill dataset"));
  dataset->rows.slice.region = dataset->region->id();
  PSWITCH_RETURN_IF_ERROR(proto::ValidateHostTensor(dataset->rows));
  PSWITCH_RETURN_IF_ERROR(
      dataset->region->CheckSlice(dataset->rows.slice.offset, dataset->rows.slice.length));
  return std::shared_ptr<const FillDataset>(std::move(dataset));
}

absl::Status CheckDatasetFitsModel(const FillDataset& dataset, const CatalogEntry& model) {
  const TensorSpec& want = model.input;
  const proto::HostTensor& got = dataset.rows;
  if (want.shape.empty()) return absl::OkStatus();  // nothing recorded to check against
  const bool dtype_fits = got.dtype == want.dtype ||
                          (want.dtype == proto::DType::I64 && got.dtype == proto::DType::I32);
  bool fits = dtype_fits && got.shape.size() == want.shape.size();
  const bool floating = want.dtype == proto::DType::F32 || want.dtype == proto::DType::F16 ||
                        want.dtype == proto::DType::BF16;
  for (size_t d = 1; fits && floating && d < want.shape.size(); ++d) {
    if (want.shape[d] > 0 && got.shape[d] != want.shape[d]) fits = false;
  }
  if (fits) return absl::OkStatus();
  auto shape = [](const std::vector<int64_t>& s) {
    std::string text = "[";
    for (size_t i = 0; i < s.size(); ++i) absl::StrAppend(&text, i > 0 ? ", " : "", s[i]);
    return text + "]";
  };
  return absl::InvalidArgumentError(absl::StrCat(
      "model '", model.request.name, "' takes '", want.name, "' of ",
      proto::EnumNameDType(want.dtype), " ", shape(want.shape), " (-1: the batch); the dataset's ",
      "'input' rows are ", proto::EnumNameDType(got.dtype), " ", shape(got.shape)));
}

absl::Status WriteOutputFile(int fd, absl::string_view bytes, absl::string_view what) {
  PSWITCH_RETURN_IF_ERROR(base::WriteAllAt(fd, bytes, 0, what));
  if (::ftruncate(fd, static_cast<off_t>(bytes.size())) != 0) {
    return ErrnoStatus(absl::StrCat("truncate ", what));
  }
  return absl::OkStatus();
}

}  // namespace pswitch::controller
