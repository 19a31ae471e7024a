// The socket link's hello and sealing (socket_link.h). Each direction of a link is a
// connection of its own, opened by the sender with a hello: magic, the sealed flag, the
// sending and receiving stages, the job, a hash of the receiving endpoint, a fresh nonce
// and, when sealed, a MAC under the link key (keyed BLAKE2b). The receiver admits the first
// hello that names it and proves the key, and no other connection after it: the run's key
// is fresh for every run, so a hello recorded from another run, or replayed at another
// link, does not prove it. The direction's seal key is derived from the link key and the
// whole hello; every message is then two ChaCha20-Poly1305 records under counter nonces
// (libsodium), so a message altered, replayed, reordered or injected fails to open.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace tandem::transport {

using LinkKey = std::array<uint8_t, 32>;

// `bytes` bytes of `v`, little-endian, at `at` (the hello's and the messages' prefix
// fields), and back.
inline void putLittle(uint8_t* at, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) at[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint64_t getLittle(const uint8_t* at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(at[i]) << (8 * i);
  return v;
}

inline constexpr size_t kLinkHelloBytes = 116;
inline constexpr size_t kSealTagBytes = 16;

struct LinkHello {
  bool sealed = false;
  int32_t src_stage = 0, dst_stage = 0;
  uint64_t job = 0;
  std::string endpoint;  // the receiver's, as the sender connects to it
};

using HelloBytes = std::array<uint8_t, kLinkHelloBytes>;

// A hello with a fresh nonce, and its MAC when `key` is given (h.sealed is then set).
HelloBytes writeHello(LinkHello h, const std::optional<LinkKey>& key);

// Why `bytes` is not a hello from the sender `expected` describes under `key` (sealed
// exactly when a key is given); empty when it is one.
std::string checkHello(const HelloBytes& bytes, const LinkHello& expected,
                       const std::optional<LinkKey>& key);

// One direction's sealing, keyed by the link key and its hello. Message n is sealed as
// two records with nonces 2n and 2n + 1; both sides count alike.
class Sealer {
 public:
  Sealer(const LinkKey& key, const HelloBytes& hello);
  ~Sealer();
  Sealer(const Sealer&) = delete;
  Sealer& operator=(const Sealer&) = delete;

  // Seals `in` into `out` (which may be `in` itself) and writes its tag; `ad` is
  // authenticated alongside.
  void seal(std::span<const uint8_t> in, uint8_t* out, uint8_t* tag, std::span<const uint8_t> ad);
  // Opens `data` in place against `tag`; false if it fails to (altered, or out of order).
  bool open(std::span<uint8_t> data, const uint8_t* tag, std::span<const uint8_t> ad);

 private:
  std::array<uint8_t, 32> key_{};
  uint64_t next_ = 0;  // the next record's nonce
};

}  // namespace tandem::transport
