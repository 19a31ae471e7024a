// tandemd: the node daemon. Listens for coordinators (`tandem run`, `tandem nodes`) on one
// TCP address, authenticates each on the cluster key, and answers them
// (runtime/daemon/daemon.h). SIGTERM or SIGINT: it says goodbye to connected peers and
// exits 0. Exit codes: 0 stopped by a signal, 1 could not start (address, key), 2 usage.
#include <fcntl.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <thread>

#include "backends/cpu/blas_core.h"
#include "core/data/text.h"
#include "core/error.h"
#include "runtime/control/handshake.h"
#include "runtime/daemon/daemon.h"
#include "runtime/node/node_info.h"
#include "runtime/node/weight_cache.h"
#include "runtime/worker/stage_worker.h"
#include "transport/context.h"

namespace {

int g_signal_pipe[2] = {-1, -1};

void onSignal(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = write(g_signal_pipe[1], &byte, 1);  // async-signal-safe
}

// The daemon until SIGTERM or SIGINT: its options from the command line's, its key read,
// its address printed; 1 (the error on stderr) when it cannot start.
int runDaemon(const std::string& listen, const std::string& key_file, const std::string& name,
              const std::string& cache_dir, const tandem::runtime::WorkerOptions& wo,
              const std::string& emulator) {
  using namespace tandem::runtime;
  // SIGTERM and SIGINT only write their number to a pipe, whichever thread they land on
  // (libraries such as OpenBLAS start threads before main, so no mask covers them all);
  // one thread reads it and stops the daemon.
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) {
    std::cerr << "tandemd: error: cannot make a pipe for signals\n";
    return 1;
  }
  struct sigaction action {};
  action.sa_handler = onSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // Room for the connections it holds (DaemonOptions: up to 512 waiting, 64 in their
  // handshake, 16 sessions, each with a descriptor or two): the soft limit raised to the
  // hard one, at most 65536.
  if (rlimit files{}; ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = std::min<rlim_t>(files.rlim_max, 65536);
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  try {
    DaemonOptions o;
    o.listen = listen;
    if (key_file == "-") {
      std::string line;
      std::getline(std::cin, line);
      o.key = parseClusterKey(line, "the key on standard input");
    } else {
      o.key = readClusterKey(key_file);
    }
    o.name = name;
    // Under qemu-user, /proc/self/exe is the emulated program, as it should be.
    o.worker_program = std::filesystem::read_symlink("/proc/self/exe").string();
    o.worker_args = {"worker",
                     "--cache-dir",
                     cache_dir,
                     "--cache-max-bytes",
                     std::to_string(wo.cache_max_bytes),
                     "--max-data-bytes",
                     std::to_string(wo.data.max_file_bytes)};
    for (const std::string& root : wo.data.roots)
      o.worker_args.insert(o.worker_args.end(), {"--data-root", root});
    if (!emulator.empty()) {
      o.worker_args.insert(o.worker_args.begin(), o.worker_program);
      o.worker_program = std::filesystem::absolute(emulator).string();
    }
    o.cache_dir = cache_dir;
    Daemon daemon(o);
    const tandem::Endpoint at = daemon.endpoint();
    if (!isLoopbackHost(at.host))
      spdlog::warn(
          "listening on {}, which other machines can reach: every connection must prove the "
          "cluster key and is encrypted with it; keep {} secret",
          at.str(), key_file);
    std::string roots;
    for (const std::string& r : wo.data.roots) roots += (roots.empty() ? "" : ", ") + r;
    spdlog::info("jobs' data is read from {} (files of at most {} bytes)", roots,
                 wo.data.max_file_bytes);
    // The bound address on stdout, for scripts that asked for port 0.
    std::cout << "listening " << at.str() << std::endl;
    std::thread waiter([&] {
      unsigned char sig = 0;
      while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
      }
      spdlog::info("{}: stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      daemon.stop();
    });
    daemon.run();
    // run() returns only after stop(), which only the waiter calls.
    waiter.join();
    spdlog::info("stopped");
    return 0;
  } catch (const tandem::Error& e) {
    std::cerr << "tandemd: error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  tandem::cpu::useFasterBlasCore(argv);  // backends/cpu/blas_core.h
  using namespace tandem::runtime;
  // Its link measurements receive large messages (transport/context.h).
  tandem::transport::keepFreedMemory();
  CLI::App app{"tandemd: the tandem node daemon"};
  app.set_version_flag("--version", buildName());
  std::string listen = "127.0.0.1:7600", key_file, name, log_level = "info";
  app.add_option("--listen", listen, "HOST:PORT to listen on (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--key", key_file,
                 "The cluster key file (`tandem keygen --cluster`); - reads the key from "
                 "standard input");
  app.add_option("--name", name, "This node's name (default: the host name)");
  std::string cache_dir = defaultWeightCacheDir();
  app.add_option("--cache-dir", cache_dir, "The node's weight cache (content-addressed)")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "debug, info, warn or error")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}))
      ->capture_default_str();
  // What a job's data may be read from (core/data/data_access.h): the Debian datasets'
  // folder, the example corpus and the daemon's data folder unless the node says
  // otherwise.
  WorkerOptions wo;
  tandem::DataAccess& data = wo.data;
  data.roots = {"/usr/share/datasets", tandem::kTextCorpusDir, "/var/lib/tandem/data"};
  auto workerOptions = [&](CLI::App* on) {
    on->add_option("--cache-max-bytes", wo.cache_max_bytes,
                   "The weight cache's size: past it the least recently used files go")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    on->add_option("--data-root", data.roots,
                   "A folder a job's data may be read from (repeat for several; / admits "
                   "any file this daemon can read)")
        ->capture_default_str();
    on->add_option("--max-data-bytes", data.max_file_bytes,
                   "The largest data file (or text folder) a job may read")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
  };
  workerOptions(&app);
  std::string emulator;
  app.add_option("--emulator", emulator,
                 "Start stage workers through this program (the path of qemu-aarch64 or "
                 "qemu-arm, when this daemon itself runs under qemu-user on a machine "
                 "without binfmt_misc)")
      ->check(CLI::ExistingFile);
  // The stage workers this daemon starts: the same program, given the run's key on
  // standard input (runtime/worker/stage_worker.h).
  std::string control;
  int slot = 0;
  CLI::App* worker = app.add_subcommand("worker", "One stage worker (started by this daemon)");
  worker->group("");
  worker->add_option("--control", control, "The coordinator's HOST:PORT")->required();
  worker->add_option("--slot", slot, "Which of the coordinator's workers this is")->required();
  worker->add_option("--cache-dir", cache_dir, "The node's weight cache");
  workerOptions(worker);
  try {
    app.parse(argc, argv);
    if (!worker->parsed() && key_file.empty()) throw CLI::RequiredError("--key");
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  spdlog::set_default_logger(spdlog::stderr_color_mt("tandemd"));
  spdlog::set_pattern("[%H:%M:%S.%e] %^%l%$ %v");
  spdlog::set_level(spdlog::level::from_str(log_level));
  if (worker->parsed()) {
    try {
      wo.cache_dir = cache_dir;
      runWorkerProcess(control, slot, wo);
      return 0;
    } catch (const std::exception& e) {
      std::cerr << "tandemd worker " << slot << ": error: " << e.what() << "\n";
      return 1;
    }
  }

  return runDaemon(listen, key_file, name, cache_dir, wo, emulator);
}
