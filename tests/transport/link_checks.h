// What the tests of both links check alike (link_test.cpp, socket_link_test.cpp): every
// dtype x codec x shape round trip, with the counts each link keeps.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "tests/test_util.h"
#include "transport/link_message.h"

namespace tandem::testing {

// For each codec, a pair from `make` (a sends, b receives) carries f32 tensors of shapes
// from empty to one large enough to be received in place, each followed by i32 labels
// (always raw): values within the codec's rounding, and the link's counters right.
template <typename L>
void checkEveryDtypeCodecAndShape(
    const std::function<
        std::pair<std::unique_ptr<L>, std::unique_ptr<L>>(const transport::LinkOptions&)>& make) {
  using namespace transport;
  cpu::CpuBackend be;
  for (Codec codec : {Codec::kRaw, Codec::kF16, Codec::kBF16, Codec::kI8}) {
    LinkOptions o;
    o.codec = codec;
    o.checksum = codec == Codec::kBF16;
    o.timeout = std::chrono::seconds(5);
    auto [a, b] = make(o);
    int64_t mb = 0;
    // {80, 100} is large enough to be received in place when raw.
    for (const Shape& s :
         {Shape{0}, Shape{1}, Shape{7, 13}, Shape{127, 3}, Shape{2, 3, 4, 5}, Shape{80, 100}}) {
      const auto v = randomVector(static_cast<uint64_t>(mb) + 1, s.numel(), -3, 3);
      a->send({MessageKind::kActivation, mb}, toDevice(be, s, v));
      std::vector<int32_t> ids(static_cast<size_t>(s.numel()));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * 7 - 3);
      a->send({MessageKind::kLabel, mb}, toDeviceI32(be, s, ids));

      const Tensor got = b->recv({MessageKind::kActivation, mb}, be);
      ASSERT_EQ(got.shape(), s);
      const auto g = toHost(got);
      for (size_t i = 0; i < v.size(); ++i) {
        const float tol = codec == Codec::kRaw    ? 0.0f
                          : codec == Codec::kF16  ? 3 * std::ldexp(1.0f, -11)
                          : codec == Codec::kBF16 ? 3 * std::ldexp(1.0f, -8)
                                                  : 3.0f / 254 * 1.001f;
        ASSERT_NEAR(g[i], v[i], tol) << codecName(codec) << " " << s;
      }
      EXPECT_EQ(toHostI32(b->recv({MessageKind::kLabel, mb}, be)), ids);  // i32 always raw
      ++mb;
    }
    EXPECT_EQ(a->stats().messages_sent, 12u);
    EXPECT_EQ(b->stats().messages_received, 12u);
    EXPECT_EQ(b->stats().rejects, 0u);
    // The 8000-value labels always, the activations when raw.
    EXPECT_EQ(b->stats().received_in_place, codec == Codec::kRaw ? 2u : 1u);
    // 8593 f32 values and 8593 i32 labels were sent; labels always travel raw.
    const uint64_t f32_wire = encodedBytes(codec, DType::kF32, 8593);
    EXPECT_EQ(a->stats().bytes_sent_raw, 2u * 8593 * 4);
    EXPECT_EQ(a->stats().bytes_sent_wire, f32_wire + 8593 * 4);
    EXPECT_EQ(b->stats().bytes_received_wire, a->stats().bytes_sent_wire);
  }
}

// b sends a's messages in a shuffled order; a receives each by its tag, and the other
// direction works on the same pair.
template <typename L>
void checkMatchedByTagWhateverTheirOrder(L& a, L& b) {
  cpu::CpuBackend be;
  std::vector<MessageTag> tags;
  for (int64_t mb = 0; mb < 6; ++mb)
    for (MessageKind k : {MessageKind::kActivation, MessageKind::kGradient})
      tags.push_back({k, mb});
  std::vector<MessageTag> shuffled = tags;
  Rng rng(3);
  for (size_t i = shuffled.size() - 1; i > 0; --i)
    std::swap(shuffled[i], shuffled[rng.below(i + 1)]);
  auto valuesOf = [](const MessageTag& t) {
    return std::vector<float>{static_cast<float>(t.microbatch), static_cast<float>(t.kind)};
  };
  for (const MessageTag& t : shuffled) b.send(t, toDevice(be, {2}, valuesOf(t)));
  for (const MessageTag& t : tags) EXPECT_EQ(toHost(a.recv(t, be)), valuesOf(t));
  EXPECT_EQ(a.buffered(), 0u);
  a.send({MessageKind::kGradient, 9}, toDevice(be, {1}, {4.5f}));
  EXPECT_EQ(toHost(b.recv({MessageKind::kGradient, 9}, be)), std::vector<float>{4.5f});
}

}  // namespace tandem::testing
