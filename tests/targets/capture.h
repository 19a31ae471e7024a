// Capturing what crosses a network namespace's interfaces, for tests that check what a
// run puts on the wire (root only: a packet socket in the namespace).
#pragma once

#include <sys/types.h>

#include <map>
#include <string>

namespace tandem::testing {

// Every frame that arrives on any interface of network namespace `netns` (a name `ip
// netns` knows), written by a child process to `path` as it comes, until stop() or the
// destructor — or at most `limit_s` seconds or `limit_bytes` bytes.
class PacketCapture {
 public:
  PacketCapture(const std::string& netns, const std::string& path, int limit_s = 300,
                long limit_bytes = 256L << 20);
  ~PacketCapture();
  PacketCapture(const PacketCapture&) = delete;
  PacketCapture& operator=(const PacketCapture&) = delete;
  // Ends the capture; its file is complete once this returns. Whether the child ran
  // (it says why not on its standard error).
  bool stop();

 private:
  std::string path_;
  pid_t pid_ = -1;
  bool ok_ = false;
};

// The TCP payloads of a capture file's IPv4 frames, concatenated per direction of each
// connection ("10.77.0.1:7600 > 10.77.0.100:40212") in the order they were captured
// (a retransmitted segment appears twice).
std::map<std::string, std::string> tcpStreams(const std::string& capture_path);

// Shannon entropy of `bytes` in bits per byte (8 for uniformly random bytes).
double entropyBits(const std::string& bytes);

}  // namespace tandem::testing
