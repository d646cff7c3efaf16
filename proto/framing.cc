#include "proto/framing.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace pswitch::proto {
namespace {

constexpr size_t kKeptCapacity = 256 << 10;

void PutLe32(uint32_t v, uint8_t* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint32_t GetLe32(const uint8_t* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(in[i]) << (8 * i);
  return v;
}

}  // namespace

absl::StatusOr<std::vector<uint8_t>> EncodeFrame(std::span<const uint8_t> payload,
                                                 uint32_t max_frame_bytes) {
  if (payload.empty()) return absl::InvalidArgumentError("cannot frame an empty payload");
  if (payload.size() > max_frame_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame of ", payload.size(), " bytes exceeds the maximum of ", max_frame_bytes, " bytes"));
  }
  std::vector<uint8_t> frame(kFrameHeaderBytes + payload.size());
  PutLe32(static_cast<uint32_t>(payload.size()), frame.data());
  std::memcpy(frame.data() + kFrameHeaderBytes, payload.data(), payload.size());
  return frame;
}

absl::StatusOr<std::vector<uint8_t>> EncodeFrame(const flatbuffers::FlatBufferBuilder& builder,
                                                 uint32_t max_frame_bytes) {
  return EncodeFrame(std::span<const uint8_t>(builder.GetBufferPointer(), builder.GetSize()),
                     max_frame_bytes);
}

void FrameDecoder::Append(std::span<const uint8_t> bytes) {
  // Compact lazily so a long-lived connection does not grow its buffer without bound.
  if (consumed_ > (1u << 20)) {
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<ptrdiff_t>(consumed_));
    consumed_ = 0;
  }
  buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
}

size_t FrameDecoder::BytesNeeded() const {
  size_t available = buffer_.size() - consumed_;
  if (available < kFrameHeaderBytes) return kFrameHeaderBytes - available;
  size_t total = kFrameHeaderBytes + GetLe32(buffer_.data() + consumed_);
  return total > available ? total - available : 1;
}

absl::StatusOr<std::optional<std::vector<uint8_t>>> FrameDecoder::Next() {
  if (!error_.ok()) return error_;
  size_t available = buffer_.size() - consumed_;
  if (available < kFrameHeaderBytes) return std::nullopt;
  uint32_t length = GetLe32(buffer_.data() + consumed_);
  if (length == 0 || length > max_frame_bytes_) {
    error_ = absl::InvalidArgumentError(length == 0 ? std::string("frame with zero length")
                                                    : absl::StrCat("frame of ", length,
                                                                   " bytes exceeds the maximum of ",
                                                                   max_frame_bytes_, " bytes"));
    return error_;
  }
  if (available < kFrameHeaderBytes + length) return std::nullopt;
  const uint8_t* begin = buffer_.data() + consumed_ + kFrameHeaderBytes;
  std::vector<uint8_t> payload(begin, begin + length);
  consumed_ += kFrameHeaderBytes + length;
  if (consumed_ == buffer_.size()) {
    // Between frames: a connection that once carried a large frame does not keep its memory.
    if (buffer_.capacity() > kKeptCapacity) {
      std::vector<uint8_t>().swap(buffer_);
    } else {
      buffer_.clear();
    }
    consumed_ = 0;
  }
  return payload;
}

}  // namespace pswitch::proto
