// Subcommands of the tandem CLI. Each add* registers its options on `app` and sets the
// callback that runs it; errors propagate as tandem::Error to main().
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <string>

namespace tandem::cli {

// A number above 0, for integer and floating-point options alike. (CLI11's
// PositiveNumber names its range as 0 to the largest double, all 309 digits of it, and
// lets nan through.)
inline CLI::Validator positiveNumber() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || v <= 0)
          return "must be a positive number, got '" + text + "'";
        return {};
      },
      "POSITIVE");
}

// A dataset: fashion-mnist, or text:PATH (a file or folder of text, byte tokens).
inline CLI::Validator datasetName() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text == "fashion-mnist" || (text.rfind("text:", 0) == 0 && text.size() > 5)) return {};
        return "must be fashion-mnist or text:PATH (a file or folder of text), got '" + text + "'";
      },
      "fashion-mnist|text:PATH");
}

// The node daemon program: `tandemd` beside this program (installed together), else in
// the build tree's targets/tandemd/. Error if neither is there.
std::string tandemdProgram();

void addTrain(CLI::App& app);
void addEval(CLI::App& app);
void addGenerate(CLI::App& app);
void addInspect(CLI::App& app);
void addImport(CLI::App& app);  // ONNX models where TANDEM_ONNX is built in
void addExport(CLI::App& app);
void addQuantize(CLI::App& app);  // int8 weights
void addDevices(CLI::App& app);
void addProfile(CLI::App& app);
void addPartition(CLI::App& app);
void addKeygen(CLI::App& app);
void addNodes(CLI::App& app);
void addSchedule(CLI::App& app);
void addRun(CLI::App& app);
void addInfer(CLI::App& app);
void addStage(CLI::App& app);
void addServe(CLI::App& app);

}  // namespace tandem::cli
