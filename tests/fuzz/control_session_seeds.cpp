// Writes a seed corpus for control_session_fuzz into the directory given as the only
// argument: a raw hello frame (and one cut short), and authenticated sessions of valid
// messages.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/control/messages.h"

namespace {

void write(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem::runtime;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  Hello hello{kProtocolVersion, "tandem 0.1.0", {}};
  hello.nonce.fill(7);
  const std::vector<uint8_t> h = encodeMessage(hello);
  std::vector<uint8_t> raw = {0, static_cast<uint8_t>(h.size()), static_cast<uint8_t>(h.size() >> 8),
                              0, 0};
  raw.insert(raw.end(), h.begin(), h.end());
  write(dir + "/raw-hello", raw);
  write(dir + "/raw-hello-cut", std::vector<uint8_t>(raw.begin(), raw.begin() + raw.size() / 2));
  const std::vector<Message> session = {
      Ping{1, 2}, Launch{0, "127.0.0.1:9", {}},
      ProfileTask{"name: m\n", 8, 1, 2, {{"cpu", 1, 1}}, 0, {4, 2}},
      LinkTask{1, LinkTaskKind::kOpen, "127.0.0.1", "", 65536, 1, 0, 1}, Leave{"bye"}};
  std::vector<uint8_t> sealed = {1};
  int n = 2;
  for (const Message& m : session) {
    const std::vector<uint8_t> bytes = encodeMessage(m);
    std::vector<uint8_t> one = {1, static_cast<uint8_t>(bytes.size()),
                                static_cast<uint8_t>(bytes.size() >> 8)};
    one.insert(one.end(), bytes.begin(), bytes.end());
    write(dir + "/sealed-" + std::to_string(n++), one);
    sealed.insert(sealed.end(), one.begin() + 1, one.end());
  }
  write(dir + "/sealed-session", sealed);
  std::printf("wrote %d seeds to %s\n", n + 1, dir.c_str());
  return 0;
}
