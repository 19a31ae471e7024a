#include "transport/link_seal.h"

#include <sodium.h>

#include <cstring>
#include <string_view>

#include "core/error.h"

namespace tandem::transport {

namespace {

constexpr std::array<uint8_t, 8> kMagic = {'t', 'd', 'm', 'l', 'i', 'n', 'k', '1'};
// Offsets: magic 0, flags 8, src 12, dst 16, job 20, endpoint hash 28, nonce 60, MAC 84.
constexpr size_t kFlags = 8, kSrc = 12, kDst = 16, kJob = 20, kEndpoint = 28, kNonce = 60,
                 kMac = 84;
static_assert(kMac + 32 == kLinkHelloBytes);

void initSodium() {
  if (sodium_init() < 0) throw Error("libsodium failed to initialise");
}

// Keyed BLAKE2b of a label and `data`: the MAC of a hello, and a direction's seal key,
// under labels of their own.
std::array<uint8_t, 32> keyedHash(const LinkKey& key, std::string_view label,
                                  std::span<const uint8_t> data) {
  crypto_generichash_state state;
  crypto_generichash_init(&state, key.data(), key.size(), 32);
  crypto_generichash_update(&state, reinterpret_cast<const uint8_t*>(label.data()), label.size());
  crypto_generichash_update(&state, data.data(), data.size());
  std::array<uint8_t, 32> out{};
  crypto_generichash_final(&state, out.data(), out.size());
  return out;
}

std::array<uint8_t, 32> endpointHash(const std::string& endpoint) {
  std::array<uint8_t, 32> out{};
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const uint8_t*>(endpoint.data()),
                     endpoint.size(), nullptr, 0);
  return out;
}

std::span<const uint8_t> macked(const HelloBytes& b) { return {b.data(), kMac}; }

}  // namespace

HelloBytes writeHello(LinkHello h, const std::optional<LinkKey>& key) {
  initSodium();
  HelloBytes b{};
  std::memcpy(b.data(), kMagic.data(), kMagic.size());
  putLittle(&b[kFlags], key ? 1 : 0, 4);
  putLittle(&b[kSrc], static_cast<uint32_t>(h.src_stage), 4);
  putLittle(&b[kDst], static_cast<uint32_t>(h.dst_stage), 4);
  putLittle(&b[kJob], h.job, 8);
  const auto hash = endpointHash(h.endpoint);
  std::memcpy(&b[kEndpoint], hash.data(), hash.size());
  randombytes_buf(&b[kNonce], kMac - kNonce);
  if (key) {
    const auto mac = keyedHash(*key, "tandem link hello 1", macked(b));
    std::memcpy(&b[kMac], mac.data(), mac.size());
  }
  return b;
}

std::string checkHello(const HelloBytes& b, const LinkHello& expected,
                       const std::optional<LinkKey>& key) {
  initSodium();
  if (std::memcmp(b.data(), kMagic.data(), kMagic.size()) != 0) return "not a tandem link's hello";
  const uint64_t flags = getLittle(&b[kFlags], 4);
  if (flags > 1) return "a hello with unknown flags " + std::to_string(flags);
  if ((flags == 1) != key.has_value())
    return key ? "an unsealed hello on a sealed link" : "a sealed hello on an unsealed link";
  if (key) {  // the MAC first: nothing else of a hello without the key is believed
    const auto mac = keyedHash(*key, "tandem link hello 1", macked(b));
    if (sodium_memcmp(mac.data(), &b[kMac], mac.size()) != 0)
      return "a hello that does not prove the run's key";
  }
  const auto src = static_cast<int32_t>(getLittle(&b[kSrc], 4));
  const auto dst = static_cast<int32_t>(getLittle(&b[kDst], 4));
  if (src != expected.src_stage || dst != expected.dst_stage)
    return "a hello from stage " + std::to_string(src) + " to stage " + std::to_string(dst) +
           ", not from " + std::to_string(expected.src_stage) + " to " +
           std::to_string(expected.dst_stage);
  if (getLittle(&b[kJob], 8) != expected.job)
    return "a hello for job " + std::to_string(getLittle(&b[kJob], 8)) + ", not " +
           std::to_string(expected.job);
  const auto hash = endpointHash(expected.endpoint);
  if (std::memcmp(&b[kEndpoint], hash.data(), hash.size()) != 0)
    return "a hello addressed to another endpoint";
  return "";
}

Sealer::Sealer(const LinkKey& key, const HelloBytes& hello)
    : key_(keyedHash(key, "tandem link seal 1", hello)) {}

Sealer::~Sealer() { sodium_memzero(key_.data(), key_.size()); }

namespace {
std::array<uint8_t, crypto_aead_chacha20poly1305_ietf_NPUBBYTES> counterNonce(uint64_t n) {
  std::array<uint8_t, crypto_aead_chacha20poly1305_ietf_NPUBBYTES> nonce{};
  putLittle(&nonce[4], n, 8);
  return nonce;
}
}  // namespace

void Sealer::seal(std::span<const uint8_t> in, uint8_t* out, uint8_t* tag,
                  std::span<const uint8_t> ad) {
  static_assert(crypto_aead_chacha20poly1305_ietf_ABYTES == kSealTagBytes);
  const auto nonce = counterNonce(next_++);
  crypto_aead_chacha20poly1305_ietf_encrypt_detached(out, tag, nullptr, in.data(), in.size(),
                                                     ad.data(), ad.size(), nullptr, nonce.data(),
                                                     key_.data());
}

bool Sealer::open(std::span<uint8_t> data, const uint8_t* tag, std::span<const uint8_t> ad) {
  const auto nonce = counterNonce(next_++);
  return crypto_aead_chacha20poly1305_ietf_decrypt_detached(data.data(), nullptr, data.data(),
                                                            data.size(), tag, ad.data(), ad.size(),
                                                            nonce.data(), key_.data()) == 0;
}

}  // namespace tandem::transport
