// Writes a seed corpus of valid control messages (one of each kind) for
// control_message_fuzz into the directory given as the only argument.
#include <cstdio>
#include <fstream>
#include <string>

#include "runtime/control/messages.h"

int main(int argc, char** argv) {
  using namespace tandem::runtime;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  Hello hello{kProtocolVersion, "tandem 0.1.0", {}};
  hello.nonce.fill(7);
  Proof proof;
  proof.mac.fill(9);
  NodeInfo node{
      "edge",    "tandem 0.1.0",
      "aarch64", 4,
      1 << 30,   1 << 29,
      0.5f,      {{"cpu", "Cortex-A72", 1 << 30, 4, false}, {"opencl:0", "GPU", 1 << 28, 8, true}},
      {"00ff"},  {"fashion-mnist"}};
  Assign interleaved;  // stage 0 of 2 holding two chunks, linked to the last stage both ways
  interleaved.stages = 2;
  interleaved.prev_replicas = interleaved.next_replicas = 1;
  interleaved.slice.layers.end = 3;
  interleaved.train.schedule = tandem::ScheduleKind::kInterleaved1F1B;
  interleaved.slice.chunks = {{0, 1}, {2, 3}};
  Assign split;  // one stage split over 3 tensor ranks, unequal shares
  split.slice.tensor = 3;
  split.slice.tensor_shares = {1, 2, 1};
  const Message all[] = {hello,
                         Assign{},
                         interleaved,
                         split,
                         proof,
                         Refused{Refusal::kAuth, "no"},
                         node,
                         Ping{1, 2},
                         Pong{1, 2, 3, 4},
                         Leave{"bye"},
                         ErrorReply{"what"},
                         ProfileTask{"name: m\n", 8, 1, 2, {{"cpu", 1, 1}}, 0, {4, 2}},
                         ProfileResult{"{}", 0, {"{}"}},
                         Checkpointed{6, std::string(64, 'a'), 100, {0.7, 0.3}},
                         Answer{8, 2, 2, {1, 2, 3, 4}, 0.5, 1},
                         Prompt{2, {104, 105}, 8, 0.7f, 5, 3},
                         PromptsDone{},
                         Token{2, 1, 101, 1.5f},
                         StageBusy{12, 40, 0.25, 1.0}};
  int n = 0;
  for (const Message& m : all) {
    const auto bytes = encodeMessage(m);
    std::ofstream(std::string(argv[1]) + "/seed-" + std::to_string(n++), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
  std::printf("wrote %d seeds to %s\n", n, argv[1]);
  return 0;
}
