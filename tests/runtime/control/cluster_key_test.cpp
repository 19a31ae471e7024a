#include "runtime/control/cluster_key.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "tests/test_util.h"
#include "transport/zmq_link.h"

namespace tandem::runtime {
namespace {

using testing::expectThrowWith;

Hello hello(uint8_t fill) {
  Hello h{{1, 0, 0}, "tandem", {}};
  h.nonce.fill(fill);
  return h;
}

TEST(ClusterKeyTest, AKeyFileIsTheOwnersAloneAndReadsBackTheSame) {
  const std::string dir = testing::freshDir("key");
  const ClusterKey k = generateClusterKey();
  writeClusterKey(k, dir + "/c.key");
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/c.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(readClusterKey(dir + "/c.key").bytes, k.bytes);
  EXPECT_NE(generateClusterKey().bytes, k.bytes);
  // An existing file others may read is made the owner's when written over.
  std::ofstream(dir + "/open.key") << "x";
  ::chmod((dir + "/open.key").c_str(), 0644);
  writeClusterKey(k, dir + "/open.key");
  ASSERT_EQ(::stat((dir + "/open.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(ClusterKeyTest, BadKeyFilesAreRefusedSayingWhy) {
  const std::string dir = testing::freshDir("key");
  expectThrowWith<IoError>([&] { readClusterKey(dir + "/none.key"); }, {"none.key"});
  writeClusterKey(generateClusterKey(), dir + "/shared.key");
  ::chmod((dir + "/shared.key").c_str(), 0644);
  expectThrowWith<InvalidArgument>([&] { readClusterKey(dir + "/shared.key"); },
                                   {"shared.key", "mode 644", "chmod 600"});
  for (const std::string& text :
       {std::string(), std::string("xyz\n"), std::string(64, 'g'), std::string(62, 'a')}) {
    const std::string path = dir + "/bad.key";
    std::ofstream(path, std::ios::trunc) << text;
    ::chmod(path.c_str(), 0600);
    expectThrowWith<FormatError>([&] { readClusterKey(path); },
                                 {"bad.key", "not a cluster key", "keygen --cluster"});
  }
}

TEST(ClusterKeyTest, ProofsAreBoundToTheKeyTheSideAndBothNonces) {
  const ClusterKey k = generateClusterKey(), other = generateClusterKey();
  const Hello c = hello(1), s = hello(2);
  const Mac client = handshakeProof(k, Side::kClient, c, s);
  EXPECT_TRUE(verifyProof(k, Side::kClient, c, s, client));
  EXPECT_FALSE(verifyProof(k, Side::kServer, c, s, client));  // no reflecting a proof back
  EXPECT_FALSE(verifyProof(other, Side::kClient, c, s, client));
  EXPECT_FALSE(verifyProof(k, Side::kClient, c, hello(3), client));  // a new server nonce
  EXPECT_FALSE(verifyProof(k, Side::kClient, hello(4), s, client));
  Hello newer = c;
  newer.version.minor = 1;
  EXPECT_FALSE(verifyProof(k, Side::kClient, newer, s, client));  // versions are bound too
}

TEST(ClusterKeyTest, EachDirectionHasItsOwnSessionKey) {
  const ClusterKey k = generateClusterKey();
  const Hello c = hello(1), s = hello(2);
  const SessionKeys client = sessionKeys(k, Side::kClient, c, s);
  const SessionKeys server = sessionKeys(k, Side::kServer, c, s);
  EXPECT_EQ(client.send, server.receive);
  EXPECT_EQ(client.receive, server.send);
  EXPECT_NE(client.send, client.receive);
  EXPECT_NE(sessionKeys(k, Side::kClient, c, hello(3)).send, client.send);
}

TEST(ClusterKeyTest, ARunsDataPlaneKeysAdmitOnlyTheRunsLinks) {
  const ClusterKey run = generateClusterKey(), other = generateClusterKey();
  const DataPlaneKeys k = dataPlaneKeys(run);
  EXPECT_EQ(k.public_key.size(), 40u);
  EXPECT_EQ(k.secret_key.size(), 40u);
  EXPECT_EQ(dataPlaneKeys(run).secret_key, k.secret_key);  // derived, not drawn
  EXPECT_NE(dataPlaneKeys(other).public_key, k.public_key);
  using namespace std::chrono_literals;
  transport::Context ctx;
  cpu::CpuBackend be;
  auto options = [](const DataPlaneKeys& keys) {
    transport::LinkOptions o;
    o.bind = "tcp://127.0.0.1:*";
    o.timeout = 1s;
    o.curve_secret_key = keys.secret_key;
    o.curve_peer_public_key = keys.public_key;
    return o;
  };
  transport::ZmqLink a(ctx, options(k)), b(ctx, options(k));
  a.connect(b.endpoint());
  b.connect(a.endpoint());
  const Tensor t = toDevice(be, Shape{3}, std::vector<float>{1, 2, 3});
  a.send({MessageKind::kActivation, 0}, t);
  EXPECT_EQ(toHost(b.recv({MessageKind::kActivation, 0}, be)), (std::vector<float>{1, 2, 3}));
  // A link holding another run's keys gets nothing through.
  transport::Context ctx2;
  transport::ZmqLink intruder(ctx2, options(dataPlaneKeys(other)));
  intruder.connect(b.endpoint());
  try {
    intruder.send({MessageKind::kActivation, 1}, t);
  } catch (const Error&) {  // it may not even be let in to queue the message
  }
  EXPECT_THROW(b.recv({MessageKind::kActivation, 1}, be), Timeout);
}

}  // namespace
}  // namespace tandem::runtime
