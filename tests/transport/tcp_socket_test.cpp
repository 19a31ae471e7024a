// The plain-socket layer (transport/tcp/socket.h): addresses, listening, connecting and
// moving bytes by a deadline, and the errors each step gives.
#include "transport/tcp/socket.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "core/error.h"
#include "tests/test_util.h"

namespace tandem::transport::tcp {
namespace {

using namespace std::chrono_literals;
using testing::expectThrowWith;

TEST(TcpSocketTest, AListenerAcceptsWhatConnectsAndBytesGoBothWays) {
  Listener listener(Address::loopback(), "the loopback", 4);
  ASSERT_GT(listener.port(), 0);
  const auto deadline = Clock::now() + 5s;
  Socket client = connectTo(listener.address(), {}, deadline, "test client");
  std::optional<Socket> server = listener.accept(deadline);
  ASSERT_TRUE(server.has_value());
  EXPECT_EQ(peerAddress(server->get()).port(), localAddress(client.get()).port());
  const std::string sent(300000, 'x');  // more than a socket buffer: waits on the reader
  std::thread writer([&] {
    EXPECT_TRUE(writeAll(client.get(), sent.data(), sent.size(), deadline, "server"));
  });
  std::string got(sent.size(), '\0');
  EXPECT_TRUE(readAll(server->get(), got.data(), got.size(), deadline, "client"));
  writer.join();
  EXPECT_EQ(got, sent);
  // Nothing more comes: the read gives up at its deadline.
  char more;
  EXPECT_FALSE(readAll(server->get(), &more, 1, Clock::now() + 50ms, "client"));
  // Nobody else connects: nothing to accept by the deadline.
  EXPECT_FALSE(listener.accept(Clock::now() + 50ms).has_value());
  client.reset();
  expectThrowWith<IoError>([&] { readAll(server->get(), &more, 1, deadline, "the client"); },
                           {"the client closed the connection"});
}

TEST(TcpSocketTest, ConnectingToNobodyIsRefusedOrTimesOut) {
  Address nobody;
  {
    Listener gone(Address::loopback(), "the loopback", 1);
    nobody = gone.address();
  }  // closed: its port refuses
  expectThrowWith<IoError>(
      [&] { connectTo(nobody, {}, Clock::now() + 5s, "connecting to nobody", false); },
      {"connecting to nobody: Connection refused"});
  const auto t0 = Clock::now();
  expectThrowWith<Timeout>([&] { connectTo(nobody, {}, Clock::now() + 100ms, "waiting"); },
                           {"waiting: refused until the deadline"});
  EXPECT_GE(Clock::now() - t0, 100ms);
}

TEST(TcpSocketTest, UnixPathsListenAndAreRemovedAfter) {
  const std::string path = testing::freshDir("tandem-tcp") + "/socket";
  {
    Listener listener(Address::unixPath(path), path, 1);
    EXPECT_EQ(::access(path.c_str(), F_OK), 0);
    Socket client = connectTo(Address::unixPath(path), {}, Clock::now() + 5s, "unix client");
    EXPECT_TRUE(listener.accept(Clock::now() + 5s).has_value());
  }
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "the listener left " << path;
  // An abstract name leaves no file and works the same.
  const std::string name = "@tandem-tcp-test-" + std::to_string(::getpid());
  Listener abstract(Address::unixPath(name), name, 1);
  Socket client = connectTo(Address::unixPath(name), {}, Clock::now() + 5s, "abstract client");
  EXPECT_TRUE(abstract.accept(Clock::now() + 5s).has_value());
  expectThrowWith<InvalidArgument>([&] { Address::unixPath(std::string(200, 'a')); },
                                   {"is longer than 107 bytes"});
}

TEST(TcpSocketTest, BadAddressesAreNamed) {
  expectThrowWith<InvalidArgument>([] { Address::resolve("not a host", "1", false); },
                                   {"cannot resolve 'not a host' port 1"});
  expectThrowWith<InvalidArgument>([] { Address::loopback(AF_UNIX); }, {"address family"});
  expectThrowWith<IoError>(
      [] { Listener l(Address::resolve("192.0.2.1", "0", true), "192.0.2.1", 1); },
      {"cannot listen on 192.0.2.1"});
}

TEST(TcpSocketTest, ALoopbackPairIsConnectedAndBlocking) {
  auto pair = loopbackPair();
  ASSERT_TRUE(pair.has_value());
  EXPECT_EQ(peerAddress(pair->first.get()).port(), localAddress(pair->second.get()).port());
  const char byte = 'k';
  ASSERT_EQ(::write(pair->first.get(), &byte, 1), 1);
  char got = 0;
  ASSERT_EQ(::read(pair->second.get(), &got, 1), 1);  // blocking: waits for it
  EXPECT_EQ(got, 'k');
}

}  // namespace
}  // namespace tandem::transport::tcp
