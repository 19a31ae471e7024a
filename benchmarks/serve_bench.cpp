// `tandem serve` over HTTP beside its engine alone, measured in the same run:
//
//   for 1, 8 and 32 concurrent streams of `--tokens` greedy tokens each on `--model` (a
//   model spec; examples/models/gpt-mini.yaml by default, examples/models/gpt-wide.yaml
//   the 10.7 M one; random weights, one CPU thread), the time to first
//   token and the decoding time per token (a stream's last token's time less its first's,
//   over its tokens less one) at p50 and p99 over the streams, and the aggregate tokens/s:
//     engine  requests submitted to serve::Engine directly, times from its tickets;
//     http    the same engine behind serve::Api and HttpServer, each stream a loopback
//             client posting `stream: true`, times where its chunks arrive;
//   overhead = http / engine of each figure. Rounds alternate the two; each figure is the
//   median of its rounds (5 by default), after a warm-up of each path.
//
// The decoding time per token is a stream's whole span over its tokens rather than each
// chunk's gap: a chunk carries a piece of text, and bytes of an unfinished UTF-8
// character wait for the next (random weights emit such bytes often), so chunks and
// tokens do not pair one to one.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/blas_core.h"
#include "backends/cpu/cpu_backend.h"
#include "benchmarks/bench_args.h"
#include "core/model_spec.h"
#include "serve/api.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

struct Stream {
  double first_s = 0, per_token_s = 0;
  int64_t tokens = 0;
};

struct Figures {
  double first_p50 = 0, first_p99 = 0, token_p50 = 0, token_p99 = 0, tokens_per_s = 0;
};

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const auto i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size(), std::max<size_t>(i, 1)) - 1];
}

Figures figures(const std::vector<Stream>& streams, double wall_s) {
  std::vector<double> first, token;
  int64_t tokens = 0;
  for (const Stream& s : streams) {
    first.push_back(s.first_s);
    token.push_back(s.per_token_s);
    tokens += s.tokens;
  }
  return {quantile(first, 0.5), quantile(first, 0.99), quantile(token, 0.5), quantile(token, 0.99),
          static_cast<double>(tokens) / wall_s};
}

std::string promptOf(int i) { return "Stream " + std::to_string(i) + " says:"; }

// `n` streams submitted to the engine at once; times from the tickets.
Figures engineRun(serve::Engine& engine, int n, int64_t tokens) {
  std::vector<std::shared_ptr<serve::Ticket>> tickets;
  std::vector<std::vector<double>> at(static_cast<size_t>(n));
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    const std::string p = promptOf(i);
    tickets.push_back(
        engine.submit(std::vector<int32_t>(p.begin(), p.end()), tokens, SamplingOptions{}, {}));
    if (!tickets.back()) throw std::runtime_error("the engine refused a stream");
  }
  std::vector<bool> ended(static_cast<size_t>(n), false);
  for (int left = n; left > 0;) {
    for (int i = 0; i < n; ++i) {
      if (ended[static_cast<size_t>(i)]) continue;
      const serve::Ticket::Taken t = tickets[static_cast<size_t>(i)]->take();
      auto& a = at[static_cast<size_t>(i)];
      a.insert(a.end(), t.at_s.begin(), t.at_s.end());
      if (t.ended) {
        ended[static_cast<size_t>(i)] = true;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<Stream> streams;
  for (const auto& a : at)
    streams.push_back({a.front(), (a.back() - a.front()) / static_cast<double>(a.size() - 1),
                       static_cast<int64_t>(a.size())});
  return figures(streams, wall);
}

// One streaming client over loopback: times (from before its request is sent) of its
// first and last text chunk, and its tokens (from the final usage chunk).
Stream httpStream(uint16_t port, int i, int64_t tokens) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    throw std::runtime_error("cannot connect");
  const std::string body =
      R"({"prompt": ")" + promptOf(i) + R"(", "max_tokens": )" + std::to_string(tokens) +
      R"(, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}})";
  const std::string req =
      "POST /v1/completions HTTP/1.1\r\nHost: b\r\nConnection: close\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  const auto t0 = Clock::now();
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string got;
  double first = -1, last = 0;
  size_t seen = 0;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 60000) <= 0) break;
    char b[8192];
    const ssize_t n = ::recv(fd, b, sizeof b, 0);
    if (n <= 0) break;
    const double now = std::chrono::duration<double>(Clock::now() - t0).count();
    got.append(b, static_cast<size_t>(n));
    // A text chunk: "text":"<something non-empty>".
    for (size_t at; (at = got.find("\"text\":\"", seen)) != std::string::npos;) {
      seen = at + 8;
      if (seen < got.size() && got[seen] != '"') {
        if (first < 0) first = now;
        last = now;
      }
    }
  }
  ::close(fd);
  const size_t u = got.find("\"completion_tokens\":");
  const int64_t n = u == std::string::npos ? 0 : std::stoll(got.substr(u + 20));
  if (n < 2 || first < 0) throw std::runtime_error("a stream ended early: " + got.substr(0, 300));
  return {first, (last - first) / static_cast<double>(n - 1), n};
}

Figures httpRun(uint16_t port, int n, int64_t tokens) {
  std::vector<Stream> streams(static_cast<size_t>(n));
  std::vector<std::thread> clients;
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i)
    clients.emplace_back([&, i] { streams[static_cast<size_t>(i)] = httpStream(port, i, tokens); });
  for (auto& c : clients) c.join();
  return figures(streams, std::chrono::duration<double>(Clock::now() - t0).count());
}

double median(std::vector<double> v) { return quantile(std::move(v), 0.5); }

int run(int argc, char** argv) {
  const char* usage =
      "serve_bench [--rounds N] [--tokens N] [--model SPEC.yaml]: tandem serve over HTTP "
      "beside its engine alone\n";
  int rounds = 5;
  int64_t tokens = 32;
  std::string spec = std::string(TANDEM_SOURCE_DIR) + "/examples/models/gpt-mini.yaml";
  for (const auto& [k, v] : bench::optionPairs("serve_bench", argc, argv, usage)) {
    if (k == "--rounds") {
      rounds = static_cast<int>(bench::wholeNumber("serve_bench", k, v, 1, 100));
    } else if (k == "--tokens") {
      tokens = bench::wholeNumber("serve_bench", k, v, 2, 96);
    } else if (k == "--model") {
      spec = std::string(v);
    } else {
      std::fprintf(stderr, "serve_bench: unknown option %.*s\n%s", static_cast<int>(k.size()),
                   k.data(), usage);
      return 2;
    }
  }
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model model(loadModelSpec(spec));
  model.build(be, 1);
  const TextShape shape = textShape(model);
  if (shape.context < tokens + 16) {
    std::fprintf(stderr, "serve_bench: %s's context of %lld tokens holds no prompt and %lld new\n",
                 shape.model.c_str(), static_cast<long long>(shape.context),
                 static_cast<long long>(tokens));
    return 2;
  }
  constexpr int kMost = 32;
  serve::Engine engine(
      [&model](const RequestSource& source, const TokenSink& sink, const CancelCheck& cancelled) {
        DecoderOptions o;
        o.max_in_flight = kMost;
        StageDecoder stage(model, StageRange{0, 1, 0, model.size()}, nullptr, nullptr, nullptr, o);
        stage.serve(source, sink, cancelled);
      },
      serve::EngineOptions{kMost, kMost});
  serve::ApiOptions ao;
  ao.model = {shape.model, shape.context};
  ao.vocab = shape.vocab;
  serve::Api api(engine, ao);
  serve::HttpServer server("127.0.0.1", 0, {}, [&api](serve::Request& r, serve::Connection& c) {
    return api.handle(r, c);
  });
  std::thread io([&server] { server.run(); });
  engineRun(engine, 8, tokens);  // warm-up (allocations, caches), not counted
  httpRun(server.port(), 8, tokens);
  std::printf(
      "%s (%.1f M parameters), 1 CPU thread, %lld greedy tokens per stream, %d rounds "
      "(medians)\n",
      shape.model.c_str(), static_cast<double>(model.paramCount()) / 1e6,
      static_cast<long long>(tokens), rounds);
  std::printf(
      "both paths: the same engine, model and thread in this process, alternated, each "
      "warmed up once;\nhttp: loopback TCP (default socket settings), clients on this "
      "machine's cores too;\nN streams / 1 stream: one path's aggregate tokens/s over its own "
      "at 1 stream, in this run\n");
  std::printf("%7s %6s %12s %12s %14s %14s %10s\n", "streams", "path", "first p50 ms",
              "first p99 ms", "ms/token p50", "ms/token p99", "tokens/s");
  std::vector<std::pair<double, double>> aggregate;  // engine, http tokens/s at 1, 8, 32
  for (const int n : {1, 8, 32}) {
    std::vector<Figures> e, h;
    for (int r = 0; r < rounds; ++r) {
      e.push_back(engineRun(engine, n, tokens));
      h.push_back(httpRun(server.port(), n, tokens));
    }
    auto med = [](const std::vector<Figures>& f, const double Figures::*m) {
      std::vector<double> v;
      for (const Figures& x : f) v.push_back(x.*m);
      return median(v);
    };
    const double Figures::*fields[] = {&Figures::first_p50, &Figures::first_p99,
                                       &Figures::token_p50, &Figures::token_p99,
                                       &Figures::tokens_per_s};
    double em[5], hm[5];
    for (int k = 0; k < 5; ++k) {
      em[k] = med(e, fields[k]);
      hm[k] = med(h, fields[k]);
    }
    std::printf("%7d %6s %12.2f %12.2f %14.3f %14.3f %10.0f\n", n, "engine", em[0] * 1e3,
                em[1] * 1e3, em[2] * 1e3, em[3] * 1e3, em[4]);
    std::printf("%7d %6s %12.2f %12.2f %14.3f %14.3f %10.0f\n", n, "http", hm[0] * 1e3, hm[1] * 1e3,
                hm[2] * 1e3, hm[3] * 1e3, hm[4]);
    std::printf("%7d %6s %12.3f %12.3f %14.3f %14.3f %10.3f\n", n, "ratio", hm[0] / em[0],
                hm[1] / em[1], hm[2] / em[2], hm[3] / em[3], hm[4] / em[4]);
    aggregate.emplace_back(em[4], hm[4]);
  }
  // What batching the sequences in flight gives: one pass over the weights per step.
  for (size_t i = 1; i < aggregate.size(); ++i)
    std::printf("%d streams / 1 stream, tokens/s: engine %.2fx, http %.2fx\n", i == 1 ? 8 : 32,
                aggregate[i].first / aggregate[0].first, aggregate[i].second / aggregate[0].second);
  server.stop();
  io.join();
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::cpu::useFasterBlasCore(argv);  // the kernels tandem's programs run
  try {
    return tandem::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "serve_bench: %s\n", e.what());
    return 1;
  }
}
