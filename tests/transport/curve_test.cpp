// CurveZMQ links: encrypted pairs work; a sender with a key the receiver did not admit,
// and a plaintext sender, get nothing through; bad key files are named.
#include <gtest/gtest.h>

#include <fstream>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "tests/test_util.h"
#include "transport/zmq_link.h"

namespace tandem::transport {
namespace {

using namespace std::chrono_literals;

std::string writeKey(const std::string& name, const std::string& key) {
  const std::string path = ::testing::TempDir() + "/curve-" + name;
  std::ofstream(path) << key << "\n";
  return path;
}

struct Keys {
  std::string secret_file, public_file;
};

Keys makeKeys(const std::string& name) {
  const CurveKeyPair k = generateCurveKeyPair();
  return {writeKey(name + ".key", k.secret_key), writeKey(name + ".pub", k.public_key)};
}

TEST(CurveTest, EncryptedLinksTalkAndIntrudersDoNot) {
  ASSERT_TRUE(curveSupported()) << "Debian's libzmq5 is built with CURVE";
  const Keys a = makeKeys("a"), b = makeKeys("b"), c = makeKeys("c");
  Context ctx;
  cpu::CpuBackend be;
  LinkOptions oa, ob;
  oa.bind = ob.bind = "tcp://127.0.0.1:*";
  oa.timeout = ob.timeout = 1s;
  oa.curve_secret_key_file = a.secret_file;
  oa.curve_peer_public_key_file = b.public_file;
  ob.curve_secret_key_file = b.secret_file;
  ob.curve_peer_public_key_file = a.public_file;
  ZmqLink la(ctx, oa), lb(ctx, ob);
  la.connect(lb.endpoint());
  lb.connect(la.endpoint());
  la.send({MessageKind::kActivation, 0}, toDevice(be, {2}, {1.5f, 2.5f}));
  EXPECT_EQ(toHost(lb.recv({MessageKind::kActivation, 0}, be)), (std::vector<float>{1.5f, 2.5f}));

  // An intruder with its own key pair, knowing b's public key, tries to reach b.
  Context other;
  LinkOptions oc;
  oc.bind = "tcp://127.0.0.1:*";
  oc.timeout = 1s;
  oc.linger = 0ms;  // its message can never be delivered
  oc.curve_secret_key_file = c.secret_file;
  oc.curve_peer_public_key_file = b.public_file;
  ZmqLink intruder(other, oc);
  intruder.connect(lb.endpoint());
  intruder.send({MessageKind::kActivation, 1}, toDevice(be, {1}, {666.0f}));
  // A plaintext sender tries too.
  zmq::socket_t plain(other.zmq(), zmq::socket_type::push);
  plain.set(zmq::sockopt::linger, 0);
  plain.connect(lb.endpoint());
  plain.send(zmq::str_buffer("hello"), zmq::send_flags::dontwait);
  testing::expectThrowWith<Timeout>(
      [&] {
        lb.recv({MessageKind::kActivation, 1}, be);
      },
      {"no (activation, microbatch 1)"});
  EXPECT_EQ(lb.stats().rejects, 0u);  // refused in the handshake, never seen as messages
  // The legitimate peer still gets through.
  la.send({MessageKind::kActivation, 2}, toDevice(be, {1}, {3.0f}));
  EXPECT_EQ(toHost(lb.recv({MessageKind::kActivation, 2}, be)), std::vector<float>{3.0f});
}

TEST(CurveTest, BadKeyFilesAreNamed) {
  Context ctx;
  LinkOptions o;
  o.bind = "inproc://curve-bad";
  o.curve_secret_key_file = writeKey("short.key", "tooshort");
  testing::expectThrowWith<InvalidArgument>([&] { ZmqLink(ctx, o); }, {"needs both"});
  o.curve_peer_public_key_file = makeKeys("ok").public_file;
  testing::expectThrowWith<InvalidArgument>([&] { ZmqLink(ctx, o); },
                                            {"short.key", "40-character Z85"});
  o.curve_secret_key_file = ::testing::TempDir() + "/curve-missing.key";
  testing::expectThrowWith<IoError>([&] { ZmqLink(ctx, o); }, {"curve-missing.key"});
}

}  // namespace
}  // namespace tandem::transport
