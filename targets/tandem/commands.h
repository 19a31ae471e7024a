// Subcommands of the tandem CLI. Each add* registers its options on `app` and sets the
// callback that runs it; errors propagate as tandem::Error to main().
#pragma once

#include <CLI/CLI.hpp>

namespace tandem::cli {

void addTrain(CLI::App& app);
void addEval(CLI::App& app);
void addInspect(CLI::App& app);
void addDevices(CLI::App& app);
void addProfile(CLI::App& app);
void addPartition(CLI::App& app);
void addKeygen(CLI::App& app);
void addSchedule(CLI::App& app);
void addRun(CLI::App& app);
void addInfer(CLI::App& app);
void addStage(CLI::App& app);
void addLinkAgent(CLI::App& app);

}  // namespace tandem::cli
