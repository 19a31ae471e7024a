// tandem generate: text from a saved language model, one process, with the key/value
// cache (core/generate.h): the prompt's bytes are the tokens; time to first token,
// tokens/s and the inter-token latency are reported.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "backends/registry.h"
#include "core/error.h"
#include "core/generate.h"
#include "core/model_file.h"
#include "targets/tandem/commands.h"

namespace tandem::cli {
namespace {

struct GenerateArgs {
  std::string file, prompt, device = "cpu";
  int64_t tokens = 64;
  SamplingOptions sampling;
  int threads = 1;
  bool serve = false, no_cache = false;
};

// The q-quantile of `v` by the nearest rank; 0 for none.
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size(), std::max<size_t>(i, 1)) - 1];
}

std::vector<int32_t> bytesOf(const std::string& text) {
  return {reinterpret_cast<const unsigned char*>(text.data()),
          reinterpret_cast<const unsigned char*>(text.data()) + text.size()};
}

struct Timing {
  double first_ms, tokens_per_s, p50_ms, p99_ms;
};

Timing timing(const Generation& g) {
  double decode_s = 0;
  for (double s : g.intervals_s) decode_s += s;
  return {g.first_token_s * 1e3,
          g.intervals_s.empty() ? 0.0 : static_cast<double>(g.intervals_s.size()) / decode_s,
          quantile(g.intervals_s, 0.5) * 1e3, quantile(g.intervals_s, 0.99) * 1e3};
}

void runGenerate(const GenerateArgs& a) {
  TANDEM_CHECK_MSG(a.tokens > 0, InvalidArgument, "--tokens must be positive, got " << a.tokens);
  TANDEM_CHECK_MSG(a.serve || !a.prompt.empty(), InvalidArgument,
                   "give --prompt TEXT, or --serve to read prompts from stdin");
  const ModelFile file = readModelFile(a.file);
  auto backend = makeBackend(a.device, BackendOptions{a.threads});
  auto model = loadModel(file, *backend);
  if (!a.serve) {
    // The prompt is printed with the first token, once the request has been accepted.
    bool first = true;
    const Generation g =
        generate(*model, bytesOf(a.prompt), a.tokens, a.sampling, !a.no_cache, [&](int32_t t) {
          if (first) std::fputs(a.prompt.c_str(), stdout);
          first = false;
          std::fputc(t, stdout);
          std::fflush(stdout);
        });
    const Timing t = timing(g);
    std::printf(
        "\n---\n%zu prompt tokens, %zu new%s: time to first token %.2f ms, %.1f tokens/s, "
        "inter-token p50 %.2f ms, p99 %.2f ms\n",
        a.prompt.size(), g.tokens.size(), a.no_cache ? " (no cache)" : "", t.first_ms,
        t.tokens_per_s, t.p50_ms, t.p99_ms);
    return;
  }
  // One JSON object per prompt line: the text and its timing.
  std::string line;
  int64_t served = 0;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    nlohmann::json out{{"prompt", line}};
    try {
      const Generation g = generate(*model, bytesOf(line), a.tokens, a.sampling, !a.no_cache);
      const Timing t = timing(g);
      out["text"] = std::string(g.tokens.begin(), g.tokens.end());
      out["first_token_ms"] = t.first_ms;
      out["tokens_per_s"] = t.tokens_per_s;
      out["inter_token_p50_ms"] = t.p50_ms;
      out["inter_token_p99_ms"] = t.p99_ms;
    } catch (const InvalidArgument& e) {  // this request only: the next may be fine
      out["error"] = e.what();
    }
    std::puts(out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    std::fflush(stdout);
    ++served;
  }
  std::fprintf(stderr, "served %lld prompts\n", static_cast<long long>(served));
}

}  // namespace

void addGenerate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* c = app.add_subcommand(
      "generate", "Generate text with a saved language model (byte tokens, key/value cache)");
  c->add_option("model", a->file, "Model file (.tdm) of a language model")
      ->required()
      ->check(CLI::ExistingFile);
  c->add_option("--prompt", a->prompt, "Text to continue");
  c->add_option("--tokens", a->tokens, "New tokens (bytes) to generate");
  c->add_option("--temperature", a->sampling.temperature,
                "0: greedy (the default); above 0: sample, sharper below 1");
  c->add_option("--top-k", a->sampling.top_k, "Sample among the k most likely tokens only");
  c->add_option("--seed", a->sampling.seed, "Seed for sampling");
  c->add_option("--device", a->device, "Device to run on");
  c->add_option("--threads", a->threads, "CPU threads")->check(CLI::Range(1, 1024));
  c->add_flag("--serve", a->serve,
              "Read prompts from stdin, one per line; answer each with a line of JSON");
  c->add_flag("--no-cache", a->no_cache,
              "Recompute the whole prefix for every token (the cache's reference)");
  c->callback([a] { runGenerate(*a); });
}

}  // namespace tandem::cli
