// The cluster key: 32 random bytes every coordinator and daemon of a cluster share, kept
// in a file (64 hex digits and a newline, mode 0600) made by `tandem keygen --cluster`.
// From it and the two fresh nonces of a handshake come the proofs each side sends and
// the session keys that seal every later message (libsodium: HMAC-SHA-512/256 for the
// proofs, keyed BLAKE2b for the session keys, ChaCha20-Poly1305 in channel.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "runtime/control/messages.h"

namespace tandem::runtime {

struct ClusterKey {
  std::array<uint8_t, 32> bytes{};
};

// A new random key (libsodium's CSPRNG).
ClusterKey generateClusterKey();
// Writes `key` to `path`, created with mode 0600 (an existing file is replaced and made
// 0600). IoError naming the path if it cannot be written.
void writeClusterKey(const ClusterKey& key, const std::string& path);
// Reads a key file. IoError if it cannot be read; FormatError naming the path if it is
// not 64 hex digits; InvalidArgument if others than its owner may read it.
ClusterKey readClusterKey(const std::string& path);

// A key from its 64 hex digits (surrounding newlines and spaces ignored); FormatError
// naming `source` otherwise.
ClusterKey parseClusterKey(std::string text, const std::string& source);
// The 64 hex digits of a key.
std::string clusterKeyHex(const ClusterKey& key);

// The CurveZMQ key pair (Z85 text) every data-plane link of a run uses, derived from the
// run's key: only holders of that key can join the run's links, and CurveZMQ's
// per-connection ephemeral keys keep each connection's traffic its own.
struct DataPlaneKeys {
  std::string public_key, secret_key;
};
DataPlaneKeys dataPlaneKeys(const ClusterKey& key);

// The key that seals a run's stage links (transport/socket_link.h), derived from the
// run's key under a label of its own.
std::array<uint8_t, 32> dataPlaneLinkKey(const ClusterKey& key);

// Which side of a handshake: the one that connected (client) or accepted (server).
enum class Side { kClient, kServer };

// The proof that `side` holds the key, over both hellos' nonces and versions: bound to
// this connection's fresh nonces, so a proof recorded from another connection is useless.
Mac handshakeProof(const ClusterKey& key, Side side, const Hello& client, const Hello& server);
// Constant-time comparison of `proof` with the one `side` should have sent.
bool verifyProof(const ClusterKey& key, Side side, const Hello& client, const Hello& server,
                 const Mac& proof);

// The two session keys of a connection: one per direction, so their nonce counters never
// meet.
struct SessionKeys {
  std::array<uint8_t, 32> send{}, receive{};
};
SessionKeys sessionKeys(const ClusterKey& key, Side side, const Hello& client, const Hello& server);

}  // namespace tandem::runtime
