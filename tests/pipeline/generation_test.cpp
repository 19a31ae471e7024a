// Pipelined generation in one process: each stage a thread with its own backend and its
// layers, neighbours and the feedback link (last stage -> first) over inproc links.
// Several sequences in flight give, sequence by sequence, the tokens and bitwise the
// logits of generating each alone in one process with the key/value cache.
#include <gtest/gtest.h>

#include <mutex>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/pipeline/stage_decoder.h"
#include "targets/runtime/job.h"
#include "tests/test_util.h"
#include "transport/zmq_link.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

constexpr const char* kGpt = R"(name: gen-gpt
input: [24]
layers:
  - embedding: {vocab: 256, dim: 16}
  - positional: {context: 24}
  - transformer: {heads: 2, mlp: 24}
  - transformer: {heads: 4}
  - transformer: {heads: 2}
  - layernorm
  - linear: {out: 256}
)";

// A linked pair of inproc links: a's end and b's end.
struct Pair {
  std::unique_ptr<transport::ZmqLink> a, b;
};
Pair linkPair(transport::Context& ctx, const std::string& name) {
  transport::LinkOptions oa, ob;
  oa.bind = "inproc://" + name + "-a";
  ob.bind = "inproc://" + name + "-b";
  oa.timeout = ob.timeout = 20s;
  Pair p{std::make_unique<transport::ZmqLink>(ctx, oa),
         std::make_unique<transport::ZmqLink>(ctx, ob)};
  p.a->connect(p.b->endpoint());
  p.b->connect(p.a->endpoint());
  return p;
}

std::vector<Generation> pipelined(int p, const std::vector<GenerationRequest>& requests) {
  static int run = 0;
  const std::string id = "gen" + std::to_string(run++);
  transport::Context ctx;
  std::vector<Pair> links;
  for (int s = 0; s + 1 < p; ++s) links.push_back(linkPair(ctx, id + "-" + std::to_string(s)));
  Pair feedback = linkPair(ctx, id + "-feedback");  // a: the last stage's end, b: stage 0's
  const auto ranges = runtime::equalStageRanges(Model(parseModelSpec(kGpt)).size(), p);
  std::vector<Generation> out;
  std::mutex mu;
  std::vector<std::exception_ptr> errors;
  std::vector<std::thread> threads;
  for (int s = 0; s < p; ++s) {
    threads.emplace_back([&, s] {
      try {
        cpu::CpuBackend be(cpu::CpuOptions{1});
        Model m(parseModelSpec(kGpt));
        const auto [begin, end] = ranges[static_cast<size_t>(s)];
        m.build(be, 7, begin, end);
        Link* prev = s > 0 ? links[static_cast<size_t>(s - 1)].b.get() : nullptr;
        Link* next = s + 1 < p ? links[static_cast<size_t>(s)].a.get() : nullptr;
        Link* back = s == 0 ? feedback.b.get() : s == p - 1 ? feedback.a.get() : nullptr;
        StageDecoder stage(m, StageRange{s, p, begin, end}, prev, next, back);
        std::vector<Generation> g = stage.run(requests);
        std::lock_guard lock(mu);
        if (s == p - 1) out = std::move(g);
      } catch (...) {
        std::lock_guard lock(mu);
        errors.push_back(std::current_exception());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) std::rethrow_exception(e);
  return out;
}

std::vector<int32_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

TEST(GenerationPipelineTest, SequencesInFlightMatchGeneratingEachAlone) {
  const std::vector<GenerationRequest> requests = {{bytes("the cat"), 9, {0.0f, 0, 1}},
                                                   {bytes("a"), 5, {0.9f, 10, 3}},
                                                   {bytes("once upon"), 12, {0.7f, 0, 4}},
                                                   {bytes("xy"), 1, {0.0f, 0, 1}}};
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model whole(parseModelSpec(kGpt));
  whole.build(be, 7);  // layer i from (seed, i): the stages' layers are the same weights
  for (const int p : {2, 3}) {
    const std::vector<Generation> got = pipelined(p, requests);
    ASSERT_EQ(got.size(), requests.size());
    for (size_t q = 0; q < requests.size(); ++q) {
      const Generation want =
          generate(whole, requests[q].prompt, requests[q].count, requests[q].sampling);
      EXPECT_EQ(got[q].tokens, want.tokens) << "p=" << p << " sequence " << q;
      ASSERT_EQ(got[q].logits.size(), want.logits.size());
      for (size_t i = 0; i < want.logits.size(); ++i)
        ASSERT_EQ(got[q].logits[i], want.logits[i])
            << "p=" << p << " sequence " << q << " token " << i;
      EXPECT_EQ(got[q].intervals_s.size(), static_cast<size_t>(requests[q].count - 1));
    }
  }
}

TEST(GenerationPipelineTest, StagesWhoseLinksDoNotMatchTheirPlaceAreRefused) {
  cpu::CpuBackend be;
  Model m(parseModelSpec(kGpt));
  m.build(be, 1);
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        StageDecoder(m, StageRange{0, 1, 0, m.size()}, nullptr, nullptr, nullptr);
      },
      {"needs 2 or more stages"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        StageDecoder(m, StageRange{0, 2, 0, 3}, nullptr, nullptr, nullptr);
      },
      {"stage 0 of 2: links do not match its place"});
}

}  // namespace
}  // namespace tandem
