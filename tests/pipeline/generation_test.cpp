// Pipelined generation in one process: each stage a thread with its own backend and its
// layers, neighbours and the feedback link (last stage -> first) over inproc links.
// Several sequences in flight give, sequence by sequence, the tokens and bitwise the
// logits of generating each alone in one process with the key/value cache.
#include <gtest/gtest.h>

#include <bit>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/pipeline/stage_decoder.h"
#include "core/pipeline/tensor_stage.h"
#include "runtime/job/job.h"
#include "tests/test_util.h"
#include "transport/local_group.h"
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
Pair linkPair(transport::Context& ctx, const std::string& name,
              std::chrono::milliseconds timeout = 20s) {
  transport::LinkOptions oa, ob;
  oa.bind = "inproc://" + name + "-a";
  ob.bind = "inproc://" + name + "-b";
  oa.timeout = ob.timeout = timeout;
  Pair p{std::make_unique<transport::ZmqLink>(ctx, oa),
         std::make_unique<transport::ZmqLink>(ctx, ob)};
  p.a->connect(p.b->endpoint());
  p.b->connect(p.a->endpoint());
  return p;
}

// Runs `body` on p stage threads of the GPT (seed 7, equal cuts), each with its own
// backend and its StageDecoder over inproc links with `timeout`.
void onStages(int p, DecoderOptions o, std::chrono::milliseconds timeout,
              const std::function<void(int s, StageDecoder&)>& body) {
  static int run = 0;
  const std::string id = "gen" + std::to_string(run++);
  transport::Context ctx;
  std::vector<Pair> links;
  for (int s = 0; s + 1 < p; ++s)
    links.push_back(linkPair(ctx, id + "-" + std::to_string(s), timeout));
  Pair feedback = linkPair(ctx, id + "-feedback", timeout);  // a: the last stage's end
  const auto ranges = runtime::equalStageRanges(Model(parseModelSpec(kGpt)).size(), p);
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
        Link* back = p == 1       ? nullptr
                     : s == 0     ? feedback.b.get()
                     : s == p - 1 ? feedback.a.get()
                                  : nullptr;
        StageDecoder stage(m, StageRange{s, p, begin, end}, prev, next, back, o);
        body(s, stage);
      } catch (...) {
        std::lock_guard lock(mu);
        errors.push_back(std::current_exception());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) std::rethrow_exception(e);
}

// StageDecoder::run on p stages: the last stage's generations.
std::vector<Generation> pipelined(int p, const std::vector<GenerationRequest>& requests) {
  std::vector<Generation> out;
  onStages(p, {}, 20s, [&](int s, StageDecoder& stage) {
    std::vector<Generation> g = stage.run(requests);
    if (s == p - 1) out = std::move(g);
  });
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
  for (const int p : {1, 2, 3}) {
    const std::vector<Generation> got = pipelined(p, requests);
    ASSERT_EQ(got.size(), requests.size());
    for (size_t q = 0; q < requests.size(); ++q) {
      const std::string what = "p=" + std::to_string(p) + " sequence " + std::to_string(q);
      // Bitwise what one process decoding it alone with the cache gives (the same products,
      // row for row) ...
      const Generation alone =
          generate(whole, requests[q].prompt, requests[q].count, requests[q].sampling, true);
      EXPECT_EQ(got[q].tokens, alone.tokens) << what;
      EXPECT_EQ(got[q].logits, alone.logits) << what;
      // ... and what recomputing the whole prefix at every step (no cache) gives: the same
      // tokens, the logits to the BLAS's rounding (expectCloseLogits).
      const Generation want =
          generate(whole, requests[q].prompt, requests[q].count, requests[q].sampling, false);
      EXPECT_EQ(got[q].tokens, want.tokens) << what;
      ASSERT_EQ(got[q].logits.size(), want.logits.size());
      for (size_t i = 0; i < want.logits.size(); ++i)
        testing::expectCloseLogits(got[q].logits[i], want.logits[i],
                                   what + " token " + std::to_string(i));
      EXPECT_EQ(got[q].intervals_s.size(), static_cast<size_t>(requests[q].count - 1));
    }
  }
}

// Two stages, the second split over tensor ranks (onTensorDecoders: each rank's heads and
// MLP features by `shares`, its own key/value cache): several sequences in flight, greedy
// and sampled, give the tokens of generating each alone in one process, and the logits to
// the all-reduces' rounding.
TEST(GenerationPipelineTest, ATensorSplitStageGeneratesWhatOneProcessDoes) {
  const std::vector<GenerationRequest> requests = {{bytes("the cat"), 9, {0.0f, 0, 1}},
                                                   {bytes("a"), 5, {0.9f, 10, 3}},
                                                   {bytes("once upon"), 12, {0.7f, 0, 4}}};
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model whole(parseModelSpec(kGpt));
  whole.build(be, 7);
  for (const std::vector<double>& shares : std::vector<std::vector<double>>{{1, 1}, {1, 3}}) {
    transport::Context ctx;
    static int run = 0;
    const std::string id = "tgen" + std::to_string(run++);
    Pair link = linkPair(ctx, id), feedback = linkPair(ctx, id + "-feedback");
    std::vector<Generation> got;
    std::exception_ptr first_error;
    std::thread first([&] {
      try {
        cpu::CpuBackend b0(cpu::CpuOptions{1});
        Model m(parseModelSpec(kGpt));
        m.build(b0, 7, 0, 3);
        StageDecoder stage(m, StageRange{0, 2, 0, 3}, nullptr, link.a.get(), feedback.b.get(), {});
        stage.run(requests);
      } catch (...) {
        first_error = std::current_exception();
      }
    });
    const auto ranks = static_cast<int>(shares.size());
    auto groups = transport::makeLocalGroup(ranks);
    std::vector<std::unique_ptr<cpu::CpuBackend>> backends;
    std::vector<std::unique_ptr<Model>> models;
    std::vector<TensorRank> parts;
    for (int r = 0; r < ranks; ++r) {
      backends.push_back(std::make_unique<cpu::CpuBackend>(cpu::CpuOptions{1}));
      models.push_back(std::make_unique<Model>(parseModelSpec(kGpt)));
      models.back()->splitForTensor(3, 7, *groups[static_cast<size_t>(r)], shares);
      models.back()->build(*backends.back(), 7, 3, 7);
      parts.push_back({models.back().get(), nullptr, groups[static_cast<size_t>(r)].get()});
    }
    EXPECT_NO_THROW(onTensorDecoders(parts, StageRange{1, 2, 3, 7}, link.b.get(), nullptr,
                                     feedback.a.get(), {}, 20s, [&](int r, StageDecoder& stage) {
                                       std::vector<Generation> g = stage.run(requests);
                                       if (r == 0) got = std::move(g);
                                     }));
    first.join();
    if (first_error) std::rethrow_exception(first_error);
    ASSERT_EQ(got.size(), requests.size());
    for (size_t q = 0; q < requests.size(); ++q) {
      const std::string what =
          "shares " + std::to_string(shares[1]) + " sequence " + std::to_string(q);
      const Generation alone =
          generate(whole, requests[q].prompt, requests[q].count, requests[q].sampling, true);
      EXPECT_EQ(got[q].tokens, alone.tokens) << what;
      ASSERT_EQ(got[q].logits.size(), alone.logits.size()) << what;
      for (size_t i = 0; i < alone.logits.size(); ++i)
        testing::expectCloseLogits(got[q].logits[i], alone.logits[i],
                                   what + " token " + std::to_string(i));
    }
  }
}

// Requests handed to stage 0 one by one by another thread, with pauses between them.
class Trickle {
 public:
  void push(GenerationRequest r) {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(r));
    cv_.notify_one();
  }
  void close() {
    std::lock_guard lock(mu_);
    closed_ = true;
    cv_.notify_one();
  }
  RequestPoll poll(std::chrono::milliseconds wait) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, wait, [&] { return closed_ || !queue_.empty(); });
    RequestPoll p;
    if (!queue_.empty()) {
      p.request = std::move(queue_.front());
      queue_.erase(queue_.begin());
    } else {
      p.ended = closed_;
    }
    return p;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<GenerationRequest> queue_;
  bool closed_ = false;
};

// Serves what `source` gives across p stage threads (links with `timeout`): each
// request's tokens and logits, by id, as the last stage's sink heard them.
std::map<int64_t, Generation> served(int p, const RequestSource& source, DecoderOptions o,
                                     std::chrono::milliseconds timeout) {
  std::map<int64_t, Generation> out;  // (only the last stage's sink writes it)
  onStages(p, o, timeout, [&](int, StageDecoder& stage) {
    stage.serve(source, [&](const ChosenToken& c) {
      Generation& g = out[c.id];
      EXPECT_EQ(c.index, static_cast<int64_t>(g.tokens.size())) << "request " << c.id;
      g.tokens.push_back(c.token);
      g.logits.push_back(c.logits);
    });
  });
  return out;
}

TEST(GenerationPipelineTest, AStreamOfRequestsIsServedAsTheyComeAndEachIsExact) {
  // Six requests, two in flight at most, arriving while others run and after idle
  // pauses three times the links' time limit: the keep-alives hold the idle stages.
  const std::vector<GenerationRequest> requests = {
      {bytes("the cat"), 6, {0.0f, 0, 1}, 40}, {bytes("a"), 4, {0.9f, 10, 3}, 41},
      {bytes("once"), 7, {0.7f, 0, 4}, 42},    {bytes("xy"), 1, {0.0f, 0, 1}, 43},
      {bytes("zz top"), 3, {1.0f, 5, 9}, 44},  {bytes("q"), 5, {0.0f, 0, 2}, 45}};
  Trickle trickle;
  std::thread feeder([&] {
    for (size_t i = 0; i < requests.size(); ++i) {
      trickle.push(requests[i]);
      std::this_thread::sleep_for(i == 2 || i == 4 ? 900ms : 5ms);
    }
    trickle.close();
  });
  DecoderOptions o;
  o.max_in_flight = 2;
  o.keepalive = 50ms;
  std::map<int64_t, Generation> got;
  try {
    got = served(
        3, [&](std::chrono::milliseconds w) { return trickle.poll(w); }, o, 300ms);
  } catch (...) {
    feeder.join();
    throw;
  }
  feeder.join();
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model whole(parseModelSpec(kGpt));
  whole.build(be, 7);
  ASSERT_EQ(got.size(), requests.size());
  for (const GenerationRequest& r : requests) {
    const Generation want = generate(whole, r.prompt, r.count, r.sampling);
    EXPECT_EQ(got[r.id].tokens, want.tokens) << "request " << r.id;
    EXPECT_EQ(got[r.id].logits, want.logits) << "request " << r.id;
  }
}

// A sink keeping each request's tokens and logits in `got` (only the last stage's is
// called).
TokenSink collectInto(std::map<int64_t, Generation>& got) {
  return [&got](const ChosenToken& c) {
    got[c.id].tokens.push_back(c.token);
    got[c.id].logits.push_back(c.logits);
  };
}

TEST(GenerationPipelineTest, ACancelledSequenceEndsOnEveryStageAndFreesItsPlace) {
  // One sequence in flight at most: request 51 is cancelled as its second token comes
  // back to stage 0, so it yields two tokens, and 52 then takes its place; the others
  // are exact, and every stage ends clean (an unfinished sequence would fail the end).
  const std::vector<GenerationRequest> requests = {{bytes("the cat"), 4, {0.0f, 0, 1}, 50},
                                                   {bytes("once"), 9, {0.7f, 0, 4}, 51},
                                                   {bytes("xy"), 6, {0.8f, 0, 5, 0.9f}, 52}};
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model whole(parseModelSpec(kGpt));
  whole.build(be, 7);
  for (const int p : {1, 2, 3}) {
    size_t next = 0;
    RequestSource source = [&](std::chrono::milliseconds) {
      RequestPoll poll;
      poll.ended = next == requests.size();
      if (!poll.ended) poll.request = requests[next++];
      return poll;
    };
    std::map<int64_t, int> asked;  // (only stage 0 asks)
    CancelCheck cancel = [&](int64_t id) { return id == 51 && ++asked[id] == 2; };
    std::map<int64_t, Generation> got;
    DecoderOptions o;
    o.max_in_flight = 1;
    onStages(p, o, 20s,
             [&](int, StageDecoder& stage) { stage.serve(source, collectInto(got), cancel); });
    const std::string what = "p=" + std::to_string(p);
    ASSERT_EQ(got.size(), 3u) << what;
    for (const GenerationRequest& r : requests) {
      const Generation want = generate(whole, r.prompt, r.count, r.sampling);
      const size_t n = r.id == 51 ? 2 : want.tokens.size();
      EXPECT_EQ(got[r.id].tokens, std::vector<int32_t>(want.tokens.begin(),
                                                       want.tokens.begin() + static_cast<long>(n)))
          << what << " request " << r.id;
      EXPECT_EQ(got[r.id].logits,
                std::vector<std::vector<float>>(want.logits.begin(),
                                                want.logits.begin() + static_cast<long>(n)))
          << what << " request " << r.id;
    }
  }
}

TEST(GenerationPipelineTest, SequencesInFlightTravelTheStagesAsBatchesAndStayExact) {
  // Eight sequences of unequal length, greedy and sampled, all in flight on 2 and 3
  // stages, one of them cancelled at its third token: every stage runs them in batches
  // (about 8 / p rows a pass once the prompts are in: far fewer passes than rows), and
  // every sequence is bitwise what generating it alone gives.
  std::vector<GenerationRequest> requests;
  for (int q = 0; q < 8; ++q)
    requests.push_back({bytes(std::string("seq ") + static_cast<char>('a' + q)),
                        8 + q % 4,
                        {q % 2 == 0 ? 0.0f : 0.8f, q % 3 == 0 ? 0 : 7, static_cast<uint64_t>(q)},
                        100 + q});
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model whole(parseModelSpec(kGpt));
  whole.build(be, 7);
  int64_t rows = 0;
  for (const GenerationRequest& r : requests) rows += r.count;
  const int64_t cancelled_id = 103, cancelled_at = 3;
  for (const int p : {2, 3}) {
    size_t next = 0;
    RequestSource source = [&](std::chrono::milliseconds) {
      RequestPoll poll;
      poll.ended = next == requests.size();
      if (!poll.ended) poll.request = requests[next++];
      return poll;
    };
    int asked = 0;
    CancelCheck cancel = [&](int64_t id) { return id == cancelled_id && ++asked == cancelled_at; };
    std::map<int64_t, Generation> got;
    std::mutex mu;
    std::vector<DecoderStats> stats(static_cast<size_t>(p));
    // Each stage's reports (its thread's own slot): at least the one as serve ends.
    std::vector<std::vector<DecoderStats>> reports(static_cast<size_t>(p));
    DecoderOptions o;
    static thread_local size_t stage_of_thread = 0;
    o.report = [&](const DecoderStats& st) {
      std::lock_guard lock(mu);
      reports[stage_of_thread].push_back(st);
    };
    onStages(p, o, 20s, [&](int s, StageDecoder& stage) {
      stage_of_thread = static_cast<size_t>(s);
      stage.serve(source, collectInto(got), cancel);
      std::lock_guard lock(mu);
      stats[static_cast<size_t>(s)] = stage.stats();
    });
    const std::string what = "p=" + std::to_string(p);
    const int64_t want_rows = rows - (requests[3].count - cancelled_at);
    for (int s = 0; s < p; ++s) {
      const DecoderStats& st = stats[static_cast<size_t>(s)];
      EXPECT_EQ(st.rows, want_rows) << what << " stage " << s;
      // 8 prompts alone, then batches of about 8 / p (fewer as sequences end): more than
      // 4 / p rows a pass on average (one, unbatched).
      EXPECT_LT(st.steps * 4, st.rows * p)
          << what << " stage " << s << ": " << st.steps << " passes";
      EXPECT_GT(st.busy_s, 0) << what << " stage " << s;
      const auto& r = reports[static_cast<size_t>(s)];
      ASSERT_FALSE(r.empty()) << what << " stage " << s;
      EXPECT_EQ(r.back().steps, st.steps) << what << " stage " << s;
      EXPECT_EQ(r.back().rows, st.rows) << what << " stage " << s;
      EXPECT_LE(r.back().busy_s, r.back().elapsed_s) << what << " stage " << s;
    }
    ASSERT_EQ(got.size(), requests.size()) << what;
    for (const GenerationRequest& r : requests) {
      const Generation want = generate(whole, r.prompt, r.count, r.sampling);
      const auto n = static_cast<long>(r.id == cancelled_id ? cancelled_at : r.count);
      EXPECT_EQ(got[r.id].tokens,
                std::vector<int32_t>(want.tokens.begin(), want.tokens.begin() + n))
          << what << " request " << r.id;
      EXPECT_EQ(got[r.id].logits,
                std::vector<std::vector<float>>(want.logits.begin(), want.logits.begin() + n))
          << what << " request " << r.id;
    }
  }
}

TEST(GenerationPipelineTest, AStepMessageThatBreaksTheProtocolIsRefusedNamingWhat) {
  // A middle stage (1 of 3) handed hand-made step messages: each breach of the protocol
  // is a FormatError naming the step, the peer and what is wrong.
  Model spec(parseModelSpec(kGpt));
  const auto ranges = runtime::equalStageRanges(spec.size(), 3);
  const auto [begin, end] = ranges[1];
  const int64_t width = 16, fields = 10;
  auto head = [&](int32_t op, int32_t id, int32_t round, int32_t length) {
    std::vector<int32_t> h(static_cast<size_t>(fields), 0);
    h[0] = op;
    h[1] = id;
    h[2] = round;
    h[3] = 4;                             // count
    h[7] = std::bit_cast<int32_t>(0.0f);  // temperature
    h[8] = std::bit_cast<int32_t>(1.0f);  // top-p
    h[9] = length;
    return h;
  };
  auto message = [&](const std::vector<std::vector<int32_t>>& heads, int64_t values) {
    std::vector<int32_t> m{static_cast<int32_t>(heads.size())};
    for (const auto& h : heads) m.insert(m.end(), h.begin(), h.end());
    m.resize(m.size() + static_cast<size_t>(values), std::bit_cast<int32_t>(0.25f));
    return m;
  };
  auto counted = [](std::vector<int32_t> m, int32_t count) {  // another entry count
    m[0] = count;
    return m;
  };
  struct Case {
    std::vector<int32_t> message;
    std::string what;
  };
  const std::vector<Case> cases = {
      {{0}, "not an entry count, headers of 10"},
      {counted(message({head(0, 1, 0, 1)}, width), 5000), "an entry count of 5000"},
      {message({head(0, 1, 0, 2), head(0, 2, 0, 2)}, 4 * width), "of 2 tokens in a step of 2"},
      {message({head(0, 1, 0, 1), head(0, 1, 0, 1)}, 2 * width), "sequence 1 twice in one step"},
      {message({head(0, 1, 0, 1), head(2, 0, 0, 0)}, 2 * width), "operation 2 in a batch of steps"},
      {message({head(1, 0, 0, 0)}, width), "a control header with an activation"},
      {message({head(0, 1, 0, 1), head(0, 2, 0, 1)}, 2 * width + 1),
       "an activation of 33 values for 2"},
      {message({head(0, 1, 3, 1)}, width), "sequence 1 round 3 is not in flight"},
      {message({head(3, 9, 0, 0)}, 0), "cancels sequence 9, which is not in flight"},
      {message({head(7, 0, 0, 0)}, 0), "unknown operation 7"},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    transport::Context ctx;
    const std::string id = "bad-step-" + std::to_string(c);
    Pair in = linkPair(ctx, id + "-in", 5s), out = linkPair(ctx, id + "-out", 5s);
    cpu::CpuBackend be(cpu::CpuOptions{1});
    Model m(parseModelSpec(kGpt));
    m.build(be, 7, begin, end);
    StageDecoder stage(m, StageRange{1, 3, begin, end}, in.b.get(), out.a.get(), nullptr);
    const std::vector<int32_t>& msg = cases[c].message;
    in.a->send({MessageKind::kActivation, 0},
               toDeviceI32(be, {static_cast<int64_t>(msg.size())}, msg));
    testing::expectThrowWith<FormatError>([&] { stage.serve({}, {}); },
                                          {"step 0 from", cases[c].what});
  }
}

TEST(GenerationPipelineTest, ARequestThatDoesNotFitTheModelIsRefusedNamingIt) {
  cpu::CpuBackend be;
  Model m(parseModelSpec(kGpt));
  m.build(be, 1);
  auto serveOne = [&](GenerationRequest r) {
    StageDecoder stage(m, StageRange{0, 1, 0, m.size()}, nullptr, nullptr, nullptr);
    bool given = false;
    stage.serve(
        [&](std::chrono::milliseconds) {
          RequestPoll p;
          if (!given) p.request = r;
          p.ended = given;
          given = true;
          return p;
        },
        {});
  };
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        serveOne({bytes(std::string(20, 'a')), 5, {}, 3});
      },
      {"request 3", "20 tokens and 5 new ones exceed the context of 24"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        serveOne({{}, 5, {}, 4});
      },
      {"request 4", "prompt is empty"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        serveOne({{65, 300}, 2, {}, 5});
      },
      {"prompt token 300 at 1", "vocab of 256"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        serveOne({{65}, 2, {-1.0f, 0, 1}, 6});
      },
      {"request 6", "temperature -1"});
}

TEST(GenerationPipelineTest, StagesWhoseLinksDoNotMatchTheirPlaceAreRefused) {
  cpu::CpuBackend be;
  Model m(parseModelSpec(kGpt));
  m.build(be, 1);
  transport::Context ctx;
  Pair pair = linkPair(ctx, "refused");
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        StageDecoder(m, StageRange{0, 1, 0, m.size()}, nullptr, nullptr, pair.a.get());
      },
      {"stage 0 of 1: links do not match its place"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        StageDecoder(m, StageRange{0, 2, 0, 3}, nullptr, nullptr, nullptr);
      },
      {"stage 0 of 2: links do not match its place"});
}

}  // namespace
}  // namespace tandem
