#include "proto/framing.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pswitch::proto {
namespace {

void PutLe32(uint32_t v, uint8_t* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint32_t GetLe32(const uint8_t* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(in[i]) << (8 * i);
  return v;
}

}  // namespace

absl::StatusOr<std::array<uint8_t, kFrameHeaderBytes>> EncodeFrameHeader(size_t payload_bytes,
                                                                         uint32_t max_frame_bytes) {
  if (payload_bytes == 0) return absl::InvalidArgumentError("cannot frame an empty payload");
  if (payload_bytes > max_frame_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame of ", payload_bytes, " bytes exceeds the maximum of ", max_frame_bytes, " bytes"));
  }
  std::array<uint8_t, kFrameHeaderBytes> header;
  PutLe32(static_cast<uint32_t>(payload_bytes), header.data());
  return header;
}

absl::StatusOr<std::vector<uint8_t>> EncodeFrame(std::span<const uint8_t> payload,
                                                 uint32_t max_frame_bytes) {
  auto header = EncodeFrameHeader(payload.size(), max_frame_bytes);
  if (!header.ok()) return header.status();
  std::vector<uint8_t> frame;
  frame.reserve(kFrameHeaderBytes + payload.size());
  frame.insert(frame.end(), header->begin(), header->end());
  frame.insert(frame.end(), payload.begin(), payload.end());
  return frame;
}

absl::StatusOr<std::vector<uint8_t>> EncodeFrame(const flatbuffers::FlatBufferBuilder& builder,
                                                 uint32_t max_frame_bytes) {
  return EncodeFrame(std::span<const uint8_t>(builder.GetBufferPointer(), builder.GetSize()),
                     max_frame_bytes);
}

size_t FrameDecoder::BufferNeeded() const {
  const size_t available = buffer_.size() - consumed_;
  if (available < kFrameHeaderBytes) return kFrameHeaderBytes - available;
  const size_t total = kFrameHeaderBytes + GetLe32(buffer_.data() + consumed_);
  return total > available ? total - available : 0;
}

void FrameDecoder::ResetBufferIfEmpty() {
  if (consumed_ != buffer_.size()) return;
  // Between frames: the memory stays for the next frame unless a burst grew it past the cap.
  if (buffer_.capacity() > kKeptBufferBytes) {
    std::vector<uint8_t>().swap(buffer_);
  } else {
    buffer_.clear();
  }
  consumed_ = 0;
}

void FrameDecoder::MaybeStartBody() {
  if (in_body() || !error_.ok()) return;
  const size_t available = buffer_.size() - consumed_;
  if (available < kFrameHeaderBytes) return;
  const uint32_t length = GetLe32(buffer_.data() + consumed_);
  // Small frames stay in the buffer; a bad length is Next's to report.
  if (length < kDirectBodyBytes || length > max_frame_bytes_) return;
  body_ = std::move(spare_);
  spare_ = std::vector<uint8_t>();
  body_.clear();
  // Address space only: the pages are touched as the bytes arrive (a fresh large allocation is
  // an untouched mapping), so a header with no body behind it costs nothing.
  body_.reserve(length);
  body_length_ = length;
  const size_t have = std::min<size_t>(available - kFrameHeaderBytes, length);
  const uint8_t* begin = buffer_.data() + consumed_ + kFrameHeaderBytes;
  body_.insert(body_.end(), begin, begin + have);
  consumed_ += kFrameHeaderBytes + have;
  ResetBufferIfEmpty();
}

void FrameDecoder::Append(std::span<const uint8_t> bytes) {
  while (!bytes.empty()) {
    if (in_body() && !body_complete()) {
      const size_t n = std::min(bytes.size(), body_length_ - body_.size());
      body_.insert(body_.end(), bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
      bytes = bytes.subspan(n);
      continue;
    }
    // Compact lazily so a long-lived connection does not grow its buffer without bound.
    if (consumed_ > (1u << 20)) {
      buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<ptrdiff_t>(consumed_));
      consumed_ = 0;
    }
    const size_t need = BufferNeeded();
    if (in_body() || !error_.ok() || need == 0) {
      // A complete frame waits for Next: what follows queues behind it.
      buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
      return;
    }
    // Up to the end of this header (or small frame), so a large frame's body goes straight to
    // its payload instead of through the buffer.
    const size_t n = std::min(bytes.size(), need);
    buffer_.insert(buffer_.end(), bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    bytes = bytes.subspan(n);
    MaybeStartBody();
  }
}

std::span<uint8_t> FrameDecoder::ReceiveSpace() {
  if (offered_ > 0) Commit(0);  // an offer never committed: its space holds no bytes
  if (!error_.ok()) return {};
  if (in_body()) {
    if (body_complete()) return {};
    const size_t old = body_.size();
    offered_ = std::min(kBodyChunkBytes, body_length_ - old);
    body_.resize(old + offered_);  // within the reserved capacity: no reallocation
    return std::span<uint8_t>(body_.data() + old, offered_);
  }
  const size_t available = buffer_.size() - consumed_;
  if (available >= kFrameHeaderBytes) {
    const uint32_t length = GetLe32(buffer_.data() + consumed_);
    if (length == 0 || length > max_frame_bytes_) return {};  // Next reports it
  }
  const size_t need = BufferNeeded();
  if (need == 0) return {};
  if (consumed_ > 0) {
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<ptrdiff_t>(consumed_));
    consumed_ = 0;
  }
  // A header (at most 4 bytes) or a small frame's rest (under kDirectBodyBytes).
  const size_t old = buffer_.size();
  offered_ = need;
  buffer_.resize(old + offered_);
  return std::span<uint8_t>(buffer_.data() + old, offered_);
}

void FrameDecoder::Commit(size_t n) {
  n = std::min(n, offered_);
  if (in_body()) {
    body_.resize(body_.size() - offered_ + n);
  } else {
    buffer_.resize(buffer_.size() - offered_ + n);
    MaybeStartBody();
  }
  offered_ = 0;
}

size_t FrameDecoder::BytesNeeded() const {
  if (in_body()) return body_complete() ? 1 : body_length_ - body_.size();
  return std::max<size_t>(BufferNeeded(), 1);
}

absl::StatusOr<std::optional<std::vector<uint8_t>>> FrameDecoder::Next() {
  if (!error_.ok()) return error_;
  if (in_body()) {
    if (!body_complete()) return std::nullopt;
    std::vector<uint8_t> payload = std::move(body_);
    body_ = std::vector<uint8_t>();
    body_length_ = 0;
    MaybeStartBody();  // the next frame may already be buffered
    return payload;
  }
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
  ResetBufferIfEmpty();
  MaybeStartBody();
  return payload;
}

void FrameDecoder::Recycle(std::vector<uint8_t> spent) {
  if (spent.capacity() > kKeptSpareBytes || spent.capacity() <= spare_.capacity()) return;
  spent.clear();
  spare_ = std::move(spent);
}

void FrameDecoder::Discard() {
  std::vector<uint8_t>().swap(buffer_);
  std::vector<uint8_t>().swap(body_);
  std::vector<uint8_t>().swap(spare_);
  consumed_ = 0;
  body_length_ = 0;
  offered_ = 0;
}

}  // namespace pswitch::proto
