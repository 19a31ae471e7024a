// tandem: train, evaluate and inspect models split across heterogeneous devices.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <iostream>
#include <new>

#include "backends/cpu/blas_core.h"
#include "core/error.h"
#include "targets/tandem/commands.h"

int main(int argc, char** argv) {
  tandem::cpu::useFasterBlasCore(argv);  // backends/cpu/blas_core.h
  CLI::App app{"tandem: train and serve neural networks across heterogeneous devices"};
  app.require_subcommand(1);
  // --help shows every option's default (subcommands inherit this).
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", "tandem 0.1.0");
  tandem::cli::addTrain(app);
  tandem::cli::addEval(app);
  tandem::cli::addGenerate(app);
  tandem::cli::addInspect(app);
  tandem::cli::addImport(app);
  tandem::cli::addExport(app);
  tandem::cli::addQuantize(app);
  tandem::cli::addDevices(app);
  tandem::cli::addProfile(app);
  tandem::cli::addPartition(app);
  tandem::cli::addKeygen(app);
  tandem::cli::addNodes(app);
  tandem::cli::addSchedule(app);
  tandem::cli::addRun(app);
  tandem::cli::addInfer(app);
  tandem::cli::addStage(app);
  tandem::cli::addServe(app);
  // Logs go to stderr; stdout carries only results (epoch summaries, accuracy, tables).
  spdlog::set_default_logger(spdlog::stderr_color_mt("tandem"));
  spdlog::set_pattern("[%H:%M:%S] %^%l%$ %v");
  // CLI11 would only say "a subcommand is required"; name the word it did not know.
  if (argc > 1 && argv[1][0] != '-') {
    try {
      app.get_subcommand(argv[1]);
    } catch (const CLI::OptionNotFound&) {
      // The commands --help lists (the hidden worker command is not one a user types).
      std::string commands;
      for (const CLI::App* sub :
           app.get_subcommands([](CLI::App* a) { return !a->get_group().empty(); }))
        commands += (commands.empty() ? "" : ", ") + sub->get_name();
      std::cerr << "error: unknown command '" << argv[1] << "' (commands: " << commands
                << "; see --help)\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version end the parse too (code 0); every other parse error is bad
    // usage, exit 2 (CLI11's own codes, 105-109, are not ours to leak).
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (const tandem::Interrupted& e) {
    std::fflush(stdout);
    std::cerr << "error: " << e.what() << "\n";
    return 130;
  } catch (const tandem::Error& e) {
    std::fflush(stdout);
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::cerr << "error: out of memory: the command needed more than this machine could "
                 "allocate (a --batch or a model too large?)\n";
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "error (internal): " << e.what() << "\n";
    return 3;
  }
  return 0;
}
