#include "runtime/control/cluster_key.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/file.h"
#include "runtime/control/files.h"

namespace tandem::runtime {

namespace {

void initSodium() {
  if (sodium_init() < 0) throw Error("libsodium failed to initialise");
}

// What each side's proof and session key is computed over: a label, then both hellos.
std::vector<uint8_t> transcript(std::string_view label, const Hello& client, const Hello& server) {
  std::vector<uint8_t> t(label.begin(), label.end());
  for (const Hello* h : {&client, &server}) {
    for (uint16_t v : {h->version.major, h->version.minor, h->version.patch}) {
      t.push_back(static_cast<uint8_t>(v & 0xff));
      t.push_back(static_cast<uint8_t>(v >> 8));
    }
    t.insert(t.end(), h->nonce.begin(), h->nonce.end());
  }
  return t;
}

std::array<uint8_t, 32> derive(const ClusterKey& key, std::string_view label, const Hello& client,
                               const Hello& server) {
  const std::vector<uint8_t> t = transcript(label, client, server);
  std::array<uint8_t, 32> out{};
  crypto_generichash(out.data(), out.size(), t.data(), t.size(), key.bytes.data(),
                     key.bytes.size());
  return out;
}

}  // namespace

ClusterKey generateClusterKey() {
  initSodium();
  ClusterKey k;
  randombytes_buf(k.bytes.data(), k.bytes.size());
  return k;
}

void writeClusterKey(const ClusterKey& key, const std::string& path) {
  const std::string hex = clusterKeyHex(key) + "\n";
  writeFileAtomically(path, {reinterpret_cast<const uint8_t*>(hex.data()), hex.size()}, 0600,
                      FileReaders::kOwnerOnly);
}

ClusterKey readClusterKey(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw IoError("cannot read the key file '" + path + "': " + std::strerror(errno));
  if ((st.st_mode & 077) != 0)
    throw InvalidArgument("the key file '" + path + "' may be read by others than its owner " +
                          "(mode " + std::to_string((st.st_mode >> 6) & 7) +
                          std::to_string((st.st_mode >> 3) & 7) + std::to_string(st.st_mode & 7) +
                          "); run: chmod 600 " + path);
  return parseClusterKey(readFile(path, "key file"), "the key file '" + path + "'");
}

ClusterKey parseClusterKey(std::string text, const std::string& source) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  ClusterKey k;
  size_t len = 0;
  const char* end = nullptr;
  if (text.size() != 64 ||
      sodium_hex2bin(k.bytes.data(), k.bytes.size(), text.data(), text.size(), nullptr, &len,
                     &end) != 0 ||
      len != k.bytes.size())
    throw FormatError(source +
                      " is not a cluster key (64 hex digits; make one with "
                      "`tandem keygen --cluster --out PREFIX`)");
  return k;
}

std::string clusterKeyHex(const ClusterKey& key) {
  std::string hex(key.bytes.size() * 2 + 1, '\0');
  sodium_bin2hex(hex.data(), hex.size(), key.bytes.data(), key.bytes.size());
  hex.pop_back();
  return hex;
}

DataPlaneKeys dataPlaneKeys(const ClusterKey& key) {
  initSodium();
  static constexpr std::string_view kLabel = "tandem data plane 1";
  std::array<uint8_t, crypto_box_SEEDBYTES> seed{};
  crypto_generichash(seed.data(), seed.size(), reinterpret_cast<const uint8_t*>(kLabel.data()),
                     kLabel.size(), key.bytes.data(), key.bytes.size());
  std::array<uint8_t, crypto_box_PUBLICKEYBYTES> pk{};
  std::array<uint8_t, crypto_box_SECRETKEYBYTES> sk{};
  crypto_box_seed_keypair(pk.data(), sk.data(), seed.data());
  char pz[41] = {}, sz[41] = {};
  zmq_z85_encode(pz, pk.data(), pk.size());
  zmq_z85_encode(sz, sk.data(), sk.size());
  sodium_memzero(sk.data(), sk.size());
  sodium_memzero(seed.data(), seed.size());
  return {pz, sz};
}

std::array<uint8_t, 32> dataPlaneLinkKey(const ClusterKey& key) {
  initSodium();
  static constexpr std::string_view kLabel = "tandem stage links 1";
  std::array<uint8_t, 32> out{};
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const uint8_t*>(kLabel.data()),
                     kLabel.size(), key.bytes.data(), key.bytes.size());
  return out;
}

Mac handshakeProof(const ClusterKey& key, Side side, const Hello& client, const Hello& server) {
  initSodium();
  static_assert(crypto_auth_hmacsha512256_BYTES == kMacBytes);
  static_assert(crypto_auth_hmacsha512256_KEYBYTES == sizeof(key.bytes));
  const std::vector<uint8_t> t = transcript(
      side == Side::kClient ? "tandem control 1 client proof" : "tandem control 1 server proof",
      client, server);
  Mac mac{};
  crypto_auth_hmacsha512256(mac.data(), t.data(), t.size(), key.bytes.data());
  return mac;
}

bool verifyProof(const ClusterKey& key, Side side, const Hello& client, const Hello& server,
                 const Mac& proof) {
  const Mac want = handshakeProof(key, side, client, server);
  return sodium_memcmp(want.data(), proof.data(), want.size()) == 0;
}

SessionKeys sessionKeys(const ClusterKey& key, Side side, const Hello& client,
                        const Hello& server) {
  initSodium();
  const auto to_server = derive(key, "tandem control 1 client to server", client, server);
  const auto to_client = derive(key, "tandem control 1 server to client", client, server);
  return side == Side::kClient ? SessionKeys{to_server, to_client}
                               : SessionKeys{to_client, to_server};
}

}  // namespace tandem::runtime
