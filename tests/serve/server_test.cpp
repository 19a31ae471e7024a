// `tandem serve`'s server in this process: the HTTP server, the engine and the routes over
// a small GPT (one stage) or a slow stand-in pipeline, driven by raw HTTP/1.1 over
// loopback sockets. Every wait is bounded.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "serve/api.h"
#include "tests/test_util.h"

namespace tandem::serve {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr const char* kGpt = R"(name: serve-gpt
input: [48]
layers:
  - embedding: {vocab: 256, dim: 16}
  - positional: {context: 48}
  - transformer: {heads: 2, mlp: 24}
  - transformer: {heads: 2}
  - layernorm
  - linear: {out: 256}
)";

// The one-stage pipeline over `model` (as `tandem serve` runs it), its stats reported to
// `loads` if given.
PipelineServe onePipeline(Model& model, int in_flight, StageLoads* loads = nullptr) {
  return [&model, in_flight, loads](const RequestSource& source, const TokenSink& sink,
                                    const CancelCheck& cancelled) {
    DecoderOptions o;
    o.max_in_flight = in_flight;
    if (loads)
      o.report = [loads](const DecoderStats& st) { loads->report(0, st.busy_s, st.elapsed_s); };
    StageDecoder stage(model, StageRange{0, 1, 0, model.size()}, nullptr, nullptr, nullptr, o);
    stage.serve(source, sink, cancelled);
  };
}

// A stand-in pipeline: every `every` each sequence in flight gets its next byte of
// `text` (cyclically), its cancel asked before each token after its first (as
// StageDecoder asks); counts the cancelled.
PipelineServe slowPipeline(int in_flight, std::chrono::milliseconds every,
                           std::atomic<int>* cancelled, std::string text = "a") {
  return [=](const RequestSource& source, const TokenSink& sink, const CancelCheck& cancel) {
    struct Live {
      GenerationRequest r;
      int64_t index = 0;
    };
    std::map<int64_t, Live> live;
    static const std::vector<float> kLogits;
    bool ended = false;
    while (!ended || !live.empty()) {
      while (!ended && static_cast<int>(live.size()) < in_flight) {
        RequestPoll p = source(live.empty() ? 50ms : 0ms);
        if (!p.request) {
          ended = p.ended;
          break;
        }
        live[p.request->id] = Live{*p.request, 0};
      }
      for (auto it = live.begin(); it != live.end();) {
        Live& l = it->second;
        if (l.index > 0 && cancel(l.r.id)) {
          ++*cancelled;
          it = live.erase(it);
          continue;
        }
        const char byte = text[static_cast<size_t>(l.index) % text.size()];
        sink(ChosenToken{l.r.id, l.index, l.r.count, static_cast<unsigned char>(byte), kLogits});
        it = ++l.index == l.r.count ? live.erase(it) : std::next(it);
      }
      std::this_thread::sleep_for(every);
    }
  };
}

// A server on 127.0.0.1 (a free port) over an engine on `pipeline`, on its own thread.
class Served {
 public:
  Served(PipelineServe pipeline, EngineOptions eo, ApiOptions ao, HttpLimits limits = {})
      : engine_(std::make_unique<Engine>(std::move(pipeline), eo)),
        api_(std::make_unique<Api>(*engine_, std::move(ao))),
        server_(std::make_unique<HttpServer>(
            "127.0.0.1", 0, limits,
            [this](Request& req, Connection& c) { return api_->handle(req, c); })),
        thread_([this] { server_->run(); }) {}
  ~Served() {
    server_->stop();
    thread_.join();
    engine_.reset();
    server_.reset();
  }
  uint16_t port() const { return server_->port(); }
  const Engine& engine() const { return *engine_; }

 private:
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Api> api_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
};

// A connected loopback socket, closed at the end.
class Client {
 public:
  explicit Client(uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      throw IoError("cannot connect to port " + std::to_string(port));
  }
  ~Client() { ::close(fd_); }
  bool send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // What arrives until the server closes or `limit` passes (or `enough` holds).
  std::string receive(std::chrono::milliseconds limit = 20s,
                      const std::function<bool(const std::string&)>& enough = {}) {
    std::string got;
    const auto end = std::chrono::steady_clock::now() + limit;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0 || (enough && enough(got))) return got;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return got;
      char b[4096];
      const ssize_t n = ::recv(fd_, b, sizeof b, 0);
      if (n <= 0) return got;
      got.append(b, static_cast<size_t>(n));
    }
  }

 private:
  int fd_;
};

struct Reply {
  int status = 0;
  std::string head, body;  // the body de-chunked
};

Reply parseReply(const std::string& raw) {
  Reply r;
  const size_t end = raw.find("\r\n\r\n");
  if (raw.size() < 12 || end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  r.head = raw.substr(0, end);
  std::string rest = raw.substr(end + 4);
  if (r.head.find("Transfer-Encoding: chunked") == std::string::npos) {
    r.body = rest;
    return r;
  }
  for (size_t at = 0; at < rest.size();) {
    const size_t line = rest.find("\r\n", at);
    if (line == std::string::npos) break;
    const size_t n = std::stoul(rest.substr(at, line - at), nullptr, 16);
    if (n == 0) break;
    r.body += rest.substr(line + 2, n);
    at = line + 2 + n + 2;
  }
  return r;
}

// One request on its own connection (closed after it).
Reply request(uint16_t port, const std::string& method, const std::string& target,
              const std::string& body = "", const std::string& headers = "") {
  Client c(port);
  c.send(method + " " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  return parseReply(c.receive());
}

// A streamed completion's events' data, in order.
std::vector<std::string> events(const std::string& body) {
  std::vector<std::string> out;
  for (size_t at = 0; (at = body.find("data: ", at)) != std::string::npos;) {
    const size_t end = body.find("\n\n", at);
    out.push_back(body.substr(at + 6, end - at - 6));
    at = end;
  }
  return out;
}

// Text as a served JSON string carries it (bytes that are not UTF-8 as U+FFFD).
std::string asServed(const std::vector<int32_t>& tokens) {
  const std::string bytes(tokens.begin(), tokens.end());
  return json::parse(json(bytes).dump(-1, ' ', false, json::error_handler_t::replace))
      .get<std::string>();
}

ApiOptions gptOptions(const Model& m) {
  ApiOptions o;
  o.model = {"serve-gpt", 48};
  o.vocab = textShape(m).vocab;
  return o;
}

std::vector<int32_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

TEST(ServeTest, CompletionsAndChatGiveTheTextGenerateGives) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model whole(parseModelSpec(kGpt));
  whole.build(be, 5);
  Model served(parseModelSpec(kGpt));
  served.build(be, 5);
  StageLoads loads;
  ApiOptions options = gptOptions(served);
  options.stages = &loads;
  Served s(onePipeline(served, 4, &loads), {4, 8}, options);
  const Generation want = generate(whole, bytes("The cat"), 12, SamplingOptions{});
  Reply r = request(s.port(), "POST", "/v1/completions",
                    R"({"prompt": "The cat", "max_tokens": 12, "temperature": 0})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["text"], asServed(want.tokens));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  // Streamed: the chunks' text is the same text, then the finish, the usage and [DONE].
  r = request(s.port(), "POST", "/v1/completions",
              R"({"prompt": "The cat", "max_tokens": 12, "temperature": 0, "stream": true,
                  "stream_options": {"include_usage": true}})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.head.find("text/event-stream"), std::string::npos) << r.head;
  const std::vector<std::string> e = events(r.body);
  ASSERT_GE(e.size(), 3u) << r.body;
  EXPECT_EQ(e.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 3 < e.size(); ++i) text += json::parse(e[i])["choices"][0]["text"];
  // (a piece cut inside a character would differ in its U+FFFDs: the whole text compares)
  EXPECT_EQ(asServed(bytes(text)), asServed(want.tokens));
  EXPECT_EQ(json::parse(e[e.size() - 3])["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(json::parse(e[e.size() - 2])["usage"]["total_tokens"], 19);
  // Chat: the template's prompt, generated alike.
  const std::string chat_prompt = "<|user|>\nhi\n<|assistant|>\n";
  const Generation chat = generate(whole, bytes(chat_prompt), 6, SamplingOptions{});
  r = request(s.port(), "POST", "/v1/chat/completions",
              R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                  "temperature": 0})");
  ASSERT_EQ(r.status, 200) << r.body;
  j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], asServed(chat.tokens));
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int64_t>(chat_prompt.size()));
  // Seeded sampling is the seed's, as generate draws it.
  const Generation sampled = generate(whole, bytes("ab"), 10, SamplingOptions{0.9f, 20, 77, 0.9f});
  r = request(s.port(), "POST", "/v1/completions",
              R"({"prompt": "ab", "max_tokens": 10, "temperature": 0.9, "top_k": 20,
                  "top_p": 0.9, "seed": 77})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], asServed(sampled.tokens));
  r = request(s.port(), "GET", "/v1/models");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["data"][0]["id"], "serve-gpt");
  r = request(s.port(), "GET", "/metrics");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find("tandem_requests_total{endpoint=\"/v1/completions\",code=\"200\"}"),
            std::string::npos)
      << r.body;
  EXPECT_NE(r.body.find("tandem_time_to_first_token_seconds_count 4"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("tandem_generated_tokens_total 40"), std::string::npos) << r.body;
  // The stage reported its work as it ran out of it: a share in [0, 1] and busy seconds.
  EXPECT_NE(
      r.body.find("# TYPE tandem_stage_busy_share gauge\ntandem_stage_busy_share{stage=\"0\"} "),
      std::string::npos)
      << r.body;
  EXPECT_GE(loads.share(0), 0);
  EXPECT_LE(loads.share(0), 1);
  const auto at = r.body.find("tandem_stage_busy_seconds_total{stage=\"0\"} ");
  ASSERT_NE(at, std::string::npos) << r.body;
  EXPECT_GT(std::stod(r.body.substr(at + 43)), 0) << r.body;
}

TEST(ServeTest, StageLoadsGiveEachStagesShareOfItsLastInterval) {
  StageLoads loads;
  EXPECT_EQ(loads.share(1), -1);
  loads.report(1, 0.5, 1.0);  // half of its first second
  EXPECT_DOUBLE_EQ(loads.share(1), 0.5);
  loads.report(1, 1.4, 2.0);  // 0.9 of the next
  EXPECT_DOUBLE_EQ(loads.share(1), 0.9);
  loads.report(0, 0.0, 2.0);
  EXPECT_DOUBLE_EQ(loads.share(0), 0);
  loads.report(1, 0.25, 1.0);  // begun anew (a re-placed stage): over its own time
  EXPECT_DOUBLE_EQ(loads.share(1), 0.25);
  const std::string text = loads.text();
  EXPECT_NE(
      text.find(
          "tandem_stage_busy_share{stage=\"0\"} 0\ntandem_stage_busy_share{stage=\"1\"} 0.25\n"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("tandem_stage_busy_seconds_total{stage=\"1\"} 0.25\n"), std::string::npos)
      << text;
}

TEST(ServeTest, AStopStringEndsTheTextWhereItBeginsAndTheSequenceWithIt) {
  std::atomic<int> cancelled{0};
  ApiOptions o;
  o.model = {"pattern", 1000};
  Served s(slowPipeline(2, 1ms, &cancelled, "hello world, hello moon\n"), {2, 4}, o);
  Reply r = request(s.port(), "POST", "/v1/completions",
                    R"({"prompt": "x", "max_tokens": 40, "stop": ["moon", "wox"]})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["text"], "hello world, hello ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["completion_tokens"], 23);  // through the stop string's last byte
  // Streamed: no piece of the stop string goes out, though "wo" and "mo" were held back.
  r = request(s.port(), "POST", "/v1/completions",
              R"({"prompt": "x", "max_tokens": 40, "stop": "moon", "stream": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  std::string text;
  const std::vector<std::string> e = events(r.body);
  for (size_t i = 0; i + 1 < e.size(); ++i) text += json::parse(e[i])["choices"][0]["text"];
  EXPECT_EQ(text, "hello world, hello ");
  EXPECT_EQ(json::parse(e[e.size() - 2])["choices"][0]["finish_reason"], "stop");
  for (int i = 0; i < 250 && cancelled < 2; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(cancelled, 2);  // both sequences left the pipeline at the stop
  // Not reached: the whole text, its held-back tail included.
  r = request(s.port(), "POST", "/v1/completions",
              R"({"prompt": "x", "max_tokens": 14, "stop": "world!"})");
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], "hello world, h");
  EXPECT_EQ(json::parse(r.body)["choices"][0]["finish_reason"], "length");
}

TEST(ServeTest, ThirtyTwoConcurrentStreamsAreEachAnsweredInFull) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model whole(parseModelSpec(kGpt));
  whole.build(be, 9);
  Model served(parseModelSpec(kGpt));
  served.build(be, 9);
  Served s(onePipeline(served, 8), {8, 32}, gptOptions(served));
  constexpr int kClients = 32;
  std::vector<std::string> got(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back([&, i] {
      const Reply r = request(s.port(), "POST", "/v1/completions",
                              R"({"prompt": "client )" + std::to_string(i) +
                                  R"(", "max_tokens": 10, "temperature": 0, "stream": true})");
      for (const std::string& e : events(r.body))
        if (e != "[DONE]") got[static_cast<size_t>(i)] += json::parse(e)["choices"][0]["text"];
      if (r.status != 200) got[static_cast<size_t>(i)] = "status " + std::to_string(r.status);
    });
  for (auto& t : clients) t.join();
  for (int i = 0; i < kClients; ++i) {
    const Generation want =
        generate(whole, bytes("client " + std::to_string(i)), 10, SamplingOptions{});
    EXPECT_EQ(asServed(bytes(got[static_cast<size_t>(i)])), asServed(want.tokens))
        << "client " << i;
  }
}

TEST(ServeTest, AFullServerAnswers429AndALeavingClientFreesItsPlace) {
  std::atomic<int> cancelled{0};
  ApiOptions o;
  o.model = {"slow", 1000};
  Served s(slowPipeline(1, 20ms, &cancelled), {1, 0}, o);
  // A stream that will take 100 x 20 ms: read its first chunk, then leave.
  auto c = std::make_unique<Client>(s.port());
  const std::string body = R"({"prompt": "x", "max_tokens": 100, "stream": true})";
  c->send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
          std::to_string(body.size()) + "\r\n\r\n" + body);
  const std::string first =
      c->receive(10s, [](const std::string& g) { return g.find("data: ") != std::string::npos; });
  ASSERT_NE(first.find("data: "), std::string::npos) << first;
  const Reply busy = request(s.port(), "POST", "/v1/completions", R"({"prompt": "y"})");
  EXPECT_EQ(busy.status, 429) << busy.body;
  EXPECT_NE(busy.head.find("Retry-After: 1"), std::string::npos) << busy.head;
  EXPECT_EQ(json::parse(busy.body)["error"]["type"], "rate_limit_exceeded");
  c.reset();  // the client leaves: its sequence is cancelled at its next token
  for (int i = 0; i < 250 && cancelled == 0; ++i) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(cancelled, 1);
  const Reply next =
      request(s.port(), "POST", "/v1/completions", R"({"prompt": "y", "max_tokens": 3})");
  ASSERT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(json::parse(next.body)["choices"][0]["text"], "aaa");
}

TEST(ServeTest, TheModelsEndOfTextTokenEndsTheAnswerAsAStopDoes) {
  // The codec's end token (a Hugging Face model's eos_token_id; here ',' of a byte model):
  // the text ends before it, finish_reason "stop", the token counted, the sequence ended.
  std::atomic<int> cancelled{0};
  ApiOptions o;
  o.model = {"pattern", 1000};
  o.codec.setEndTokens({','});
  Served s(slowPipeline(2, 1ms, &cancelled, "hello world, hello moon\n"), {2, 4}, o);
  Reply r = request(s.port(), "POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 40})");
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["text"], "hello world");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  r = request(s.port(), "POST", "/v1/chat/completions",
              R"({"messages": [{"role": "user", "content": "hi"}], "stream": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  std::string text;
  const std::vector<std::string> e = events(r.body);
  for (size_t i = 0; i + 1 < e.size(); ++i) {
    const json chunk = json::parse(e[i]);
    const json& c = chunk["choices"][0];
    if (c.contains("delta") && c["delta"].contains("content")) text += c["delta"]["content"];
  }
  EXPECT_EQ(text, "hello world");
  EXPECT_EQ(json::parse(e[e.size() - 2])["choices"][0]["finish_reason"], "stop") << r.body;
  for (int i = 0; i < 250 && cancelled < 2; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(cancelled, 2);  // both sequences left the pipeline at the end token
}

TEST(ServeTest, ARequestPastItsDeadlineEndsWhereItIsAsALengthCappedAnswer) {
  // One place, 20 ms a token, a deadline of 200 ms: a request of 100 tokens (2 s) ends
  // after a few, whole or streamed, with finish_reason "length" and its usage; one that
  // waited behind it past the deadline ends with no tokens; the server goes on.
  std::atomic<int> cancelled{0};
  ApiOptions o;
  o.model = {"slow", 1000};
  Served s(slowPipeline(1, 20ms, &cancelled), {1, 4, 200ms}, o);
  Reply first, queued;
  std::thread behind([&] {
    std::this_thread::sleep_for(50ms);
    queued = request(s.port(), "POST", "/v1/completions", R"({"prompt": "y", "max_tokens": 100})");
  });
  first = request(s.port(), "POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 100})");
  behind.join();
  for (const Reply* r : {&first, &queued}) {
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length") << r->body;
    const std::string text = j["choices"][0]["text"];
    EXPECT_LT(text.size(), 100u) << r->body;
    EXPECT_EQ(j["usage"]["completion_tokens"], static_cast<int64_t>(text.size())) << r->body;
  }
  const std::string streamed = request(s.port(), "POST", "/v1/completions",
                                       R"({"prompt": "x", "max_tokens": 100, "stream": true})")
                                   .body;
  EXPECT_NE(streamed.find(R"("finish_reason":"length")"), std::string::npos) << streamed;
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos) << streamed;
  std::string streamed_text;
  const std::vector<std::string> e = events(streamed);
  for (size_t i = 0; i + 1 < e.size(); ++i)
    streamed_text += json::parse(e[i])["choices"][0]["text"];
  EXPECT_LT(streamed_text.size(), 100u) << streamed;
  EXPECT_THROW(Engine(slowPipeline(1, 1ms, &cancelled), {1, 0, -1ms}), InvalidArgument);
}

TEST(ServeTest, KeysAreAskedOnEveryRouteButHealth) {
  std::atomic<int> cancelled{0};
  ApiOptions o;
  o.model = {"slow", 100};
  o.keys = {"key-0123456789abcdef", "another-key-0123456789"};
  Served s(slowPipeline(2, 1ms, &cancelled), {2, 2}, o);
  EXPECT_EQ(request(s.port(), "GET", "/health").status, 200);
  Reply r = request(s.port(), "GET", "/v1/models");
  EXPECT_EQ(r.status, 401) << r.body;
  EXPECT_NE(r.head.find("WWW-Authenticate: Bearer"), std::string::npos) << r.head;
  EXPECT_EQ(request(s.port(), "GET", "/metrics").status, 401);
  EXPECT_EQ(
      request(s.port(), "GET", "/v1/models", "", "Authorization: Bearer key-0123456789abcdeX\r\n")
          .status,
      401);
  EXPECT_EQ(
      request(s.port(), "GET", "/v1/models", "", "Authorization: key-0123456789abcdef\r\n").status,
      401);
  EXPECT_EQ(
      request(s.port(), "GET", "/v1/models", "", "Authorization: Bearer key-0123456789abcdef\r\n")
          .status,
      200);
  r = request(s.port(), "POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 2})",
              "Authorization: Bearer another-key-0123456789\r\n");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(request(s.port(), "POST", "/v1/completions", R"({"prompt": "x"})").status, 401);
}

TEST(ServeTest, HostileRequestsGet4xxAndTheServerGoesOn) {
  std::atomic<int> cancelled{0};
  ApiOptions o;
  o.model = {"slow", 100};
  HttpLimits limits;
  limits.request_timeout = 400ms;
  Served s(slowPipeline(2, 1ms, &cancelled), {2, 2}, o, limits);
  // A body announced at 100 MB: refused before it is read.
  {
    Client c(s.port());
    c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{\"pro");
    EXPECT_EQ(parseReply(c.receive(5s)).status, 413);
  }
  // A header over 16 KiB.
  EXPECT_EQ(
      request(s.port(), "GET", "/health", "", "X-Big: " + std::string(20000, 'a') + "\r\n").status,
      431);
  // Not HTTP.
  {
    Client c(s.port());
    c.send("HELLO THERE\r\n\r\n");
    EXPECT_EQ(parseReply(c.receive(5s)).status, 400);
  }
  // Headers a byte every 100 ms: 408 once the request's time is up, the connection closed.
  {
    Client c(s.port());
    const std::string slow = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: abcdefghijklmnop\r\n";
    const auto t0 = std::chrono::steady_clock::now();
    for (const char ch : slow) {
      if (!c.send(std::string(1, ch))) break;
      std::this_thread::sleep_for(100ms);
      if (std::chrono::steady_clock::now() - t0 > 3s) break;
    }
    const Reply r = parseReply(c.receive(5s));
    EXPECT_EQ(r.status, 408) << r.head;
  }
  // Bad JSON, invalid UTF-8, out-of-range and unknown fields: 400 naming them.
  for (const auto& [body, what] : std::vector<std::pair<std::string, std::string>>{
           {"{\"prompt\": ", "not valid JSON"},
           {"{\"prompt\": \"\xc3\x28\"}", "not valid JSON"},
           {R"({"prompt": "x", "max_tokens": -5})", "max_tokens"},
           {R"({"prompt": "x", "max_tokens": 99999999999})", "max_tokens"},
           {R"({"prompt": "x", "tools": []})", "unknown field 'tools'"}}) {
    const Reply r = request(s.port(), "POST", "/v1/completions", body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_NE(r.body.find(what), std::string::npos) << r.body;
  }
  EXPECT_EQ(request(s.port(), "GET", "/v1/completions").status, 405);
  EXPECT_EQ(request(s.port(), "GET", "/etc/passwd").status, 404);
  EXPECT_EQ(
      request(s.port(), "POST", "/v1/completions", R"({"prompt": "x", "model": "other"})").status,
      404);
  // Still serving.
  const Reply ok =
      request(s.port(), "POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 2})");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(request(s.port(), "GET", "/health").status, 200);
}

// A flood of idle connections without a key: each address may hold only so many (the
// rest get 429 at once), idle ones are closed when their request time is up, and a
// client with the key is then served.
TEST(ServeTest, IdleConnectionsAreBoundedAndClosedAndKeyedClientsServedAfter) {
  std::atomic<int> cancelled{0};
  ApiOptions o;
  o.model = {"slow", 100};
  o.keys = {"key-0123456789abcdef"};
  HttpLimits limits;
  limits.max_per_source = 4;
  limits.max_connections = 8;
  limits.request_timeout = 300ms;
  Served s(slowPipeline(2, 1ms, &cancelled), {2, 2}, o, limits);
  std::vector<std::unique_ptr<Client>> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(std::make_unique<Client>(s.port()));
  std::this_thread::sleep_for(50ms);  // accepted, counted
  const Reply refused = request(s.port(), "GET", "/health");
  EXPECT_EQ(refused.status, 429) << refused.head;
  // Each idle connection is closed once its request time is up (nothing was sent: no 408).
  for (auto& c : idle) EXPECT_EQ(c->receive(3s), "");
  const Reply ok =
      request(s.port(), "GET", "/v1/models", "", "Authorization: Bearer key-0123456789abcdef\r\n");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(request(s.port(), "GET", "/v1/models").status, 401);
}

TEST(ServeTest, KeyFilesAreCheckedAsTheClusterKeyIs) {
  const std::string dir = testing::freshDir("serve-keys");
  const std::string path = dir + "/keys";
  std::ofstream(path) << "# keys\n\nkey-0123456789abcdef\n  second-key-0123456789  \n";
  ::chmod(path.c_str(), 0600);
  EXPECT_EQ(readApiKeys(path),
            (std::vector<std::string>{"key-0123456789abcdef", "second-key-0123456789"}));
  ::chmod(path.c_str(), 0644);
  testing::expectThrowWith<InvalidArgument>([&] { readApiKeys(path); }, {"read by others"});
  std::ofstream(path) << "short\n";
  ::chmod(path.c_str(), 0600);
  testing::expectThrowWith<InvalidArgument>([&] { readApiKeys(path); },
                                            {path + ":1:", "16 to 256 printable"});
  std::ofstream(path) << "# only a comment\n";
  testing::expectThrowWith<InvalidArgument>([&] { readApiKeys(path); }, {"holds no key"});
  testing::expectThrowWith<IoError>([&] { readApiKeys(dir + "/none"); }, {"cannot read"});
}

}  // namespace
}  // namespace tandem::serve
