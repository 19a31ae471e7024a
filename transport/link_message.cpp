#include "transport/link_message.h"

namespace tandem::transport {

void encodePayload(const LinkOptions& o, std::map<MessageKind, ErrorFeedback>& feedback,
                   const MessageTag& tag, const Tensor& t, WireHeader& h,
                   std::vector<uint8_t>& out) {
  if (t.dtype() != DType::kF32 || o.codec == Codec::kRaw) {
    out.resize(t.bytes());
    if (t.bytes()) t.backend().download(t, out.data());
    return;
  }
  // A host tensor is encoded where it lies; device memory is staged on the host first.
  std::vector<float> staged;
  const auto* host = static_cast<const float*>(t.backend().hostData(t));
  if (!host) {
    staged = toHost(t);
    host = staged.data();
  }
  const std::span<const float> values(host, static_cast<size_t>(t.numel()));
  Encoded e;
  e.payload = std::move(out);  // encode into the caller's buffer's memory
  if (o.error_feedback && tag.kind == MessageKind::kGradient) {
    feedback[tag.kind].encode(o.codec, values, e, o.int8_block);
  } else {
    encode(o.codec, values, e, o.int8_block);
  }
  h.codec = o.codec;
  h.block = e.block;
  h.scales = std::move(e.scales);
  out = std::move(e.payload);
}

void addressHeader(const LinkOptions& o, const MessageTag& tag, const Tensor& t,
                   std::span<const uint8_t> payload, WireHeader& h) {
  h.job = o.job;
  h.src_stage = o.stage;
  h.dst_stage = o.peer_stage;
  h.microbatch = tag.microbatch;
  h.kind = tag.kind;
  h.dtype = t.dtype();
  h.shape = t.shape();
  h.payload_bytes = payload.size();
  if (o.checksum) h.checksum = payloadChecksum(payload);
}

Tensor decodePayload(const WireHeader& h, std::span<const uint8_t> bytes, Backend& backend) {
  Tensor t = backend.empty(h.shape, h.dtype);
  if (h.codec == Codec::kRaw) {
    if (t.bytes()) backend.upload(t, bytes.data());
    return t;
  }
  // Codecs read 2-byte values in place; a payload at an odd address is copied to aligned
  // memory first.
  std::vector<uint8_t> aligned;
  std::span<const uint8_t> in = bytes;
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint16_t) != 0) {
    aligned.assign(bytes.begin(), bytes.end());
    in = aligned;
  }
  const auto n = static_cast<size_t>(h.shape.numel());
  // A fresh host tensor is decoded into directly; device memory via a host copy.
  if (auto* host = static_cast<float*>(const_cast<void*>(backend.hostData(t)))) {
    decode(h.codec, in, h.scales, h.block, {host, n});
  } else {
    std::vector<float> values(n);
    decode(h.codec, in, h.scales, h.block, values);
    backend.upload(t, values.data());
  }
  return t;
}

std::string describeTag(const MessageTag& tag) {
  // Appends rather than "(" + std::string(...): GCC 12 at -O3 warns falsely (-Wrestrict)
  // on a literal plus a temporary string.
  std::string s(1, '(');
  s.append(messageKindName(tag.kind))
      .append(", microbatch ")
      .append(std::to_string(tag.microbatch));
  return s.append(1, ')');
}

BufferPool::Buffer BufferPool::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.empty()) return std::make_unique<std::vector<uint8_t>>();
  Buffer b = std::move(free_.back());
  free_.pop_back();
  return b;
}

void BufferPool::give(Buffer b) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (b && free_.size() < keep_) free_.push_back(std::move(b));
}

}  // namespace tandem::transport
