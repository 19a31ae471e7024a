// `tandem serve` of a job whose stage is lost mid-stream: every client's stream goes on
// after a pause (the stages placed anew on the nodes left, each sequence prefilled again
// from its prompt and the tokens it had) and gives the text of a run without the loss.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/generate.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "tests/targets/tandemd_util.h"
#include "tests/test_util.h"

namespace {

using namespace std::chrono_literals;
using namespace tandem::testing::daemons;
using nlohmann::json;

// Enough work per token (a few hundred thousand weights over the stages) that 8 streams
// of 400 tokens last seconds here, long after each has begun.
constexpr const char* kGpt = R"(name: gpt-recover
input: [448]
layers:
  - embedding: {vocab: 256, dim: 96}
  - positional: {context: 448}
  - transformer: {heads: 4, mlp: 384}
  - transformer: {heads: 4, mlp: 384}
  - layernorm
  - linear: {out: 256}
)";
constexpr int kStreams = 8;
constexpr int64_t kTokens = 400;

// Text as a served JSON string carries it (bytes that are not UTF-8 as U+FFFD).
std::string asServed(const std::string& bytes) {
  return json::parse(json(bytes).dump(-1, ' ', false, json::error_handler_t::replace))
      .get<std::string>();
}

// A stream's chunks: their text, in order, and how it ended ("" if it did not).
struct Streamed {
  int chunks = 0;
  std::string text, finish;
  bool done = false;  // data: [DONE]
};
Streamed readStream(const std::string& path) {
  Streamed s;
  std::istringstream lines(slurp(path));
  for (std::string line; std::getline(lines, line);) {
    if (line == "data: [DONE]") s.done = true;
    if (line.rfind("data: {", 0) != 0) continue;
    const json chunk = json::parse(line.substr(6), nullptr, false);
    if (chunk.is_discarded()) continue;  // (the file's last line, half written)
    ++s.chunks;
    const json& c = chunk["choices"][0];
    s.text += c["text"].get<std::string>();
    if (c["finish_reason"].is_string()) s.finish = c["finish_reason"].get<std::string>();
  }
  return s;
}

// The processes whose parent is `parent` (a daemon's workers).
std::vector<pid_t> childrenOf(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = slurp("/proc/" + name + "/stat");
    const auto paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(paren + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// A 3-stage job served over HTTP to 8 streaming clients (6 greedy, 2 sampled). Once every
// stream is under way, node b (stage 1) is frozen, so that what is in flight is known, and
// killed: every stream completes, its text the one one process generates (the fault-free
// run's), the loss and the pause are printed, and no process is left behind.
TEST(TandemdTest, StreamsServedByAJobThatLosesAStageCompleteWithTheTextOfARunWithoutTheLoss) {
  const std::string dir = tandem::testing::freshDir("recover-serve");
  const std::string tag = std::to_string(getpid());
  std::ofstream(dir + "/c.yaml") << "nodes:\n  - {name: a-" << tag << ", devices: [{}]}\n"
                                 << "  - {name: b-" << tag << ", devices: [{}]}\n"
                                 << "  - {name: c-" << tag << ", devices: [{}]}\n";
  std::ofstream(dir + "/gpt.yaml") << kGpt;
  tandem::cpu::CpuBackend be;
  tandem::Model m(tandem::parseModelSpec(kGpt));
  m.build(be, 21);
  tandem::saveModel(dir + "/gpt.tdm", m, nullptr, {});
  std::ofstream(dir + "/job.yaml") << "model: gpt.yaml\nweights: gpt.tdm\ncluster: c.yaml\n"
                                   << "partition: [[0, 2], [2, 4], [4, 6]]\n";
  std::vector<std::string> prompts, bodies, want;
  for (int i = 0; i < kStreams; ++i) {
    prompts.push_back("stream " + std::to_string(i) + " says:");
    tandem::SamplingOptions o;
    if (i >= 6) o = {0.9f, 0, static_cast<uint64_t>(100 + i)};
    const std::vector<int32_t> p(prompts.back().begin(), prompts.back().end());
    const tandem::Generation g = tandem::generate(m, p, kTokens, o);
    want.push_back(asServed(std::string(g.tokens.begin(), g.tokens.end())));
    bodies.push_back(json{
        {"prompt", prompts.back()},
        {"max_tokens", kTokens},
        {"temperature", o.temperature},
        {"seed", o.seed},
        {"stream", true}}.dump());
  }

  Background server(
      "exec " + kCli + " serve " + dir + "/job.yaml --listen 127.0.0.1:0 " + "--in-flight 8",
      dir + "/serve.log");
  ASSERT_TRUE(server.waitFor("serving", 120s)) << server.output();
  std::smatch port;
  const std::string head = server.output();
  ASSERT_TRUE(std::regex_search(head, port, std::regex("http://127\\.0\\.0\\.1:([0-9]+)/v1")))
      << head;
  std::vector<std::unique_ptr<Background>> clients;
  for (int i = 0; i < kStreams; ++i) {
    std::ofstream(dir + "/body" + std::to_string(i) + ".json") << bodies[i];
    clients.push_back(std::make_unique<Background>(
        "exec curl -sN --max-time 240 -H 'Content-Type: application/json' -d @" + dir + "/body" +
            std::to_string(i) + ".json http://127.0.0.1:" + port[1].str() + "/v1/completions",
        dir + "/stream" + std::to_string(i) + ".txt"));
  }
  auto stream = [&](int i) { return readStream(dir + "/stream" + std::to_string(i) + ".txt"); };
  // Every stream under way (a few chunks each).
  const auto until = std::chrono::steady_clock::now() + 120s;
  for (bool going = false; !going && std::chrono::steady_clock::now() < until;) {
    going = true;
    for (int i = 0; i < kStreams; ++i) going = going && stream(i).chunks >= 3;
    if (!going) std::this_thread::sleep_for(10ms);
  }
  const std::vector<pid_t> daemon = processesWith("--name b-" + tag);
  ASSERT_EQ(daemon.size(), 1u) << "node b's tandemd";
  std::vector<pid_t> frozen = childrenOf(daemon[0]);
  ASSERT_FALSE(frozen.empty()) << "node b's worker";
  frozen.push_back(daemon[0]);
  for (const pid_t p : frozen) kill(p, SIGSTOP);
  std::this_thread::sleep_for(300ms);  // what was past stage 1 reaches its clients
  int under_way = 0;
  for (int i = 0; i < kStreams; ++i) {
    const Streamed s = stream(i);
    EXPECT_GE(s.chunks, 3) << "stream " << i << " had not begun when node b was frozen";
    under_way += s.done ? 0 : 1;
  }
  EXPECT_EQ(under_way, kStreams) << "streams that had ended when node b was frozen";
  for (const pid_t p : frozen) kill(p, SIGKILL);

  for (int i = 0; i < kStreams; ++i) {
    EXPECT_EQ(clients[static_cast<size_t>(i)]->wait(240s), 0) << "curl of stream " << i;
    const Streamed s = stream(i);
    EXPECT_TRUE(s.done) << "stream " << i;
    EXPECT_EQ(s.finish, "length") << "stream " << i;
    EXPECT_EQ(asServed(s.text), want[static_cast<size_t>(i)]) << "stream " << i;
  }
  const std::string out = server.output();
  for (const std::string& s :
       {"stage 1 was lost with node 'b-" + tag + "'",
        "recovering (1 of 3 restarts): node 'b-" + tag + "' is left out; resuming " +
            std::to_string(under_way) + " sequences in flight",
        std::string("generating again ")})
    EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out;
  const auto again = out.find("generating again ");
  if (again != std::string::npos)
    std::printf("%s\n", out.substr(again, out.find('\n', again) - again).c_str());
  server.signal(SIGTERM);
  EXPECT_EQ(server.wait(60s), 0) << server.output();
  for (const char* node : {"a-", "b-", "c-"})
    EXPECT_TRUE(processesWith("--name " + std::string(node) + tag).empty()) << node;
}

}  // namespace
