// libFuzzer target for a stage's socket link as its receiving side sees it (the bytes
// anyone who can reach a worker's port may send). The first byte picks the sender:
//   even: it writes the rest as raw bytes (hellos, prefixes, frames of any length) and
//         closes;
//   odd:  it says a hello that proves the key, then sends the rest as messages sealed as a
//         link seals them, each a 2-byte little-endian header length, a 2-byte payload
//         length, the header's bytes and the payload's (any content: the link must take
//         or refuse each), and closes.
// The link must end every session with a tandem Error (timed out, refused, closed, failed
// to open, a full buffer) and never crash, hang or raise anything else.
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "transport/link_seal.h"
#include "transport/socket_link.h"
#include "transport/tcp/socket.h"

namespace {

using namespace std::chrono_literals;
using namespace tandem;
using namespace tandem::transport;

LinkKey fuzzKey() {
  LinkKey k{};
  k.fill(0x5a);
  return k;
}

// The receiving side: tags asked for in turn until the link ends it.
void drain(SocketLink& link) {
  cpu::CpuBackend be;
  try {
    for (int64_t mb = 0;; ++mb)
      for (MessageKind kind : {MessageKind::kActivation, MessageKind::kGradient})
        (void)link.recv({kind, mb % 4}, be);
  } catch (const Error&) {  // over: timed out, closed, failed to open, refused
  }
}

void writeAll(const tcp::Socket& s, std::span<const uint8_t> bytes) {
  if (!bytes.empty())
    (void)tcp::writeAll(s.get(), bytes.data(), bytes.size(), tcp::Clock::now() + 2s, "fuzz");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  LinkOptions o;
  o.bind = "tcp://127.0.0.1:*";
  o.stage = 1;
  o.peer_stage = 0;
  o.timeout = 30ms;  // a stranger turned away leaves nothing to wait for
  o.max_buffered_messages = 8;
  o.limits.max_payload_bytes = 1 << 20;
  o.limits.max_header_bytes = 1 << 16;
  const bool sealed = (data[0] & 1) != 0;
  SocketLink link(o, fuzzKey());
  const std::string at = link.endpoint();
  const std::string rest = at.substr(6);
  const size_t colon = rest.rfind(':');
  try {
    tcp::Socket s =
        tcp::connectTo(tcp::Address::resolve(rest.substr(0, colon), rest.substr(colon + 1), false),
                       {0, false}, tcp::Clock::now() + 2s, "fuzz sender");
    if (!sealed) {
      writeAll(s, {data + 1, size - 1});
    } else {
      const HelloBytes hello = writeHello({true, 0, 1, 0, at}, fuzzKey());
      writeAll(s, hello);
      Sealer seal(fuzzKey(), hello);
      for (size_t i = 1; i + 4 <= size;) {
        const size_t hn = std::min<size_t>(data[i] | data[i + 1] << 8, size - i - 4);
        const size_t pn = std::min<size_t>(data[i + 2] | data[i + 3] << 8, size - i - 4 - hn);
        std::vector<uint8_t> frame(16 + hn + kSealTagBytes + pn + kSealTagBytes);
        putLittle(frame.data(), hn, 4);
        putLittle(frame.data() + 8, pn, 8);
        uint8_t* head = frame.data() + 16;
        uint8_t* body = head + hn + kSealTagBytes;
        seal.seal({data + i + 4, hn}, head, head + hn, {frame.data(), 16});
        seal.seal({data + i + 4 + hn, pn}, body, body + pn, {});
        writeAll(s, frame);
        i += 4 + hn + pn;
      }
    }
    ::shutdown(s.get(), SHUT_WR);
    drain(link);
  } catch (const Error&) {  // the connection failed: nothing was fuzzed
  }
  return 0;
}
