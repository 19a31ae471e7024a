#include "core/pipeline/timeline.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <sstream>

namespace tandem {

namespace {

const char* spanName(ActionType t) {
  switch (t) {
    case ActionType::kForward:
      return "forward";
    case ActionType::kBackward:
      return "backward";
    case ActionType::kWeightGradient:
      return "weight gradient";
    case ActionType::kSendActivation:
      return "send activation";
    case ActionType::kRecvActivation:
      return "wait activation";
    case ActionType::kSendGradient:
      return "send gradient";
    case ActionType::kRecvGradient:
      return "wait gradient";
    case ActionType::kStep:
      return "optimizer step";
  }
  return "?";
}

bool isCompute(ActionType t) {
  return t == ActionType::kForward || t == ActionType::kBackward ||
         t == ActionType::kWeightGradient || t == ActionType::kStep;
}

// "stage 1", or "stage 1.0" for replica 0 of a replicated stage 1.
std::string rowName(const StageSpans& s) {
  std::string name = std::string("stage ").append(std::to_string(s.stage));
  if (s.replica >= 0) name.append(".").append(std::to_string(s.replica));
  return name;
}

}  // namespace

std::string chromeTrace(const std::vector<StageSpans>& stages) {
  double origin = std::numeric_limits<double>::max();
  for (const StageSpans& s : stages)
    for (const Span& span : s.spans) origin = std::min(origin, span.start_s);
  std::ostringstream os;
  os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  bool first = true;
  char buf[256];
  for (size_t row = 0; row < stages.size(); ++row) {
    const StageSpans& s = stages[row];
    const int tid = static_cast<int>(row);
    std::snprintf(buf, sizeof buf,
                  "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
                  "\"args\":{\"name\":\"%s\"}}",
                  first ? "" : ",", tid, rowName(s).c_str());
    os << buf;
    first = false;
    for (const Span& span : s.spans) {
      std::snprintf(buf, sizeof buf,
                    ",{\"name\":\"%s %lld\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,"
                    "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"microbatch\":%lld}}",
                    spanName(span.type), static_cast<long long>(span.microbatch),
                    isCompute(span.type) ? "compute" : "transfer", tid,
                    (span.start_s - origin) * 1e6, (span.end_s - span.start_s) * 1e6,
                    static_cast<long long>(span.microbatch));
      os << buf;
    }
  }
  os << "]}\n";
  return os.str();
}

std::string timelineSvg(const std::vector<StageSpans>& stages, double begin_s, double end_s,
                        int width) {
  const int row = 28, label = 70, top = 24;
  const double span_s = std::max(end_s - begin_s, 1e-9);
  const double scale = (width - label - 10) / span_s;
  const auto height = static_cast<int>(top + row * stages.size() + 30);
  std::ostringstream os;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                "font-family=\"monospace\" font-size=\"11\">\n"
                "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
                "<text x=\"%d\" y=\"15\">%.1f ms; forward blue, backward orange, optimizer "
                "grey; blank is idle</text>\n",
                width, height, label, span_s * 1e3);
  os << buf;
  for (size_t r = 0; r < stages.size(); ++r) {
    const int y = top + static_cast<int>(r) * row;
    std::snprintf(buf, sizeof buf,
                  "<text x=\"4\" y=\"%d\">%s</text>\n<line x1=\"%d\" y1=\"%d\" x2=\"%d\" "
                  "y2=\"%d\" stroke=\"#ddd\"/>\n",
                  y + 17, rowName(stages[r]).c_str(), label, y + row - 2, width - 10, y + row - 2);
    os << buf;
    for (const Span& s : stages[r].spans) {
      if (!isCompute(s.type) || s.end_s <= begin_s || s.start_s >= end_s) continue;
      const double x0 = label + (std::max(s.start_s, begin_s) - begin_s) * scale;
      const double x1 = label + (std::min(s.end_s, end_s) - begin_s) * scale;
      const char* fill = s.type == ActionType::kForward          ? "#4e79a7"
                         : s.type == ActionType::kBackward       ? "#f28e2b"
                         : s.type == ActionType::kWeightGradient ? "#edc948"
                                                                 : "#999999";
      std::snprintf(buf, sizeof buf,
                    "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\" "
                    "stroke=\"white\" stroke-width=\"0.5\"><title>%s %lld</title></rect>\n",
                    x0, y + 2, std::max(x1 - x0, 0.5), row - 6, fill, spanName(s.type),
                    static_cast<long long>(s.microbatch));
      os << buf;
      if (x1 - x0 > 14 && s.type != ActionType::kStep) {
        std::snprintf(buf, sizeof buf,
                      "<text x=\"%.2f\" y=\"%d\" fill=\"white\" text-anchor=\"middle\">%lld"
                      "</text>\n",
                      (x0 + x1) / 2, y + 17, static_cast<long long>(s.microbatch));
        os << buf;
      }
    }
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace tandem
