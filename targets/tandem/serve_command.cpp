// tandem serve: the OpenAI-compatible HTTP API (serve/) over a language model in this
// process. Listening beyond loopback asks for API keys (--api-key-file) unless
// --insecure-no-auth says otherwise; SIGINT/SIGTERM stop it.
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "backends/registry.h"
#include "core/endpoint.h"
#include "core/error.h"
#include "core/generate.h"
#include "core/model_file.h"
#include "core/pipeline/stage_decoder.h"
#include "runtime/daemon/daemon.h"
#include "runtime/job/model_source.h"
#include "serve/api.h"
#include "serve/engine.h"
#include "serve/http_server.h"
#include "targets/tandem/commands.h"
#include "targets/tandem/interrupt.h"

namespace tandem::cli {
namespace {

struct ServeArgs {
  std::string file, listen = "127.0.0.1:8080", key_file, name, device = "cpu";
  bool insecure_no_auth = false;
  int threads = 1, in_flight = 8, max_queue = 32;
  size_t max_body = 1 << 20;
  double request_timeout_s = 30;
};

void runServe(const ServeArgs& a) {
  const std::string ext = std::filesystem::path(a.file).extension().string();
  TANDEM_CHECK_MSG(ext != ".yaml" && ext != ".yml", Unsupported,
                   "serving a job's stages over HTTP is not built yet: serve a model file "
                   "(.tdm, .onnx), or use `tandem generate "
                       << a.file << " --serve` for the job");
  const Endpoint at = parseEndpoint(a.listen, true);
  std::vector<std::string> keys;
  if (!a.key_file.empty()) keys = serve::readApiKeys(a.key_file);
  TANDEM_CHECK_MSG(
      !keys.empty() || a.insecure_no_auth || runtime::isLoopbackHost(at.host), InvalidArgument,
      "--listen " << a.listen
                  << " is not loopback: give --api-key-file (a key per line, mode 600), "
                  << "or --insecure-no-auth to serve anyone who can reach it");

  const ModelFile file = runtime::readModelOrOnnx(a.file);
  auto backend = makeBackend(a.device, BackendOptions{a.threads});
  auto model = loadModel(file, *backend);
  const TextShape shape = textShape(*model);
  serve::ApiOptions options;
  options.model = {a.name.empty() ? shape.model : a.name, shape.context};
  options.vocab = shape.vocab;
  options.keys = keys;
  struct stat st {};
  if (::stat(a.file.c_str(), &st) == 0) options.created = static_cast<int64_t>(st.st_mtime);
  // The whole model as one stage: its sequences in flight interleave step by step.
  const int in_flight = a.in_flight;
  Model& m = *model;
  auto engine = std::make_unique<serve::Engine>(
      [&m, in_flight](const RequestSource& source, const TokenSink& sink,
                      const CancelCheck& cancelled) {
        DecoderOptions o;
        o.max_in_flight = in_flight;
        StageDecoder stage(m, StageRange{0, 1, 0, m.size()}, nullptr, nullptr, nullptr, o);
        stage.serve(source, sink, cancelled);
      },
      serve::EngineOptions{a.in_flight, a.max_queue});
  serve::Api api(*engine, options);
  serve::HttpLimits limits;
  limits.max_body = a.max_body;
  limits.request_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(a.request_timeout_s * 1e3));
  serve::HttpServer server(
      at.host, at.port, limits,
      [&api](serve::Request& req, serve::Connection& c) { return api.handle(req, c); });
  const InterruptGuard interrupt_guard;
  std::thread watcher([&server] {
    while (g_interrupt.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    server.stop();
  });
  // The address a client uses (and tests read): after the port is bound.
  std::printf("serving '%s' (context %lld tokens) on http://%s:%u/v1 (%s)\n",
              options.model.name.c_str(), static_cast<long long>(shape.context), at.host.c_str(),
              server.port(), keys.empty() ? "no API key asked" : "API keys asked");
  std::fflush(stdout);
  server.run();
  engine.reset();  // every sequence ends while the server's I/O context still exists
  watcher.join();
  spdlog::info("stopped");
}

}  // namespace

void addServe(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* c = app.add_subcommand(
      "serve",
      "Serve a language model over HTTP: the OpenAI completions and chat API, streaming, "
      "API keys, limits, metrics");
  c->add_option("model", a->file, "Model file (.tdm) or ONNX model (.onnx) of a language model")
      ->required()
      ->check(CLI::ExistingFile);
  c->add_option("--listen", a->listen, "HOST:PORT to listen on (port 0: any free one)");
  c->add_option("--api-key-file", a->key_file,
                "Accepted API keys, one per line (mode 600); asked as 'Authorization: Bearer'")
      ->check(CLI::ExistingFile);
  c->add_flag("--insecure-no-auth", a->insecure_no_auth,
              "Listen beyond loopback without API keys (anyone who reaches it may use it)");
  c->add_option("--name", a->name, "The model's name in the API (default: the model's own)");
  c->add_option("--in-flight", a->in_flight, "Sequences decoding at once")
      ->check(CLI::Range(1, 1024));
  c->add_option("--max-queue", a->max_queue,
                "Requests waiting beyond those in flight; more are answered 429")
      ->check(CLI::Range(0, 65536));
  c->add_option("--max-body", a->max_body, "Largest request body, bytes (413 beyond)")
      ->check(CLI::Range(size_t{1024}, size_t{1} << 30));
  c->add_option("--request-timeout", a->request_timeout_s,
                "Seconds a client may take to send a whole request (408 beyond)")
      ->check(CLI::Range(0.1, 3600.0));
  c->add_option("--device", a->device, "Device to run on");
  c->add_option("--threads", a->threads, "CPU threads")->check(CLI::Range(1, 1024));
  c->callback([a] { runServe(*a); });
}

}  // namespace tandem::cli
