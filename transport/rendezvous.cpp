#include "transport/rendezvous.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace tandem::transport {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

Exchange fileExchange(const std::string& dir, int rank, int size,
                      std::chrono::milliseconds timeout) {
  return [dir, rank, size, timeout](const std::string& mine) {
    namespace fs = std::filesystem;
    fs::create_directories(dir);
    const fs::path final_path = fs::path(dir) / ("rank-" + std::to_string(rank));
    const fs::path tmp = fs::path(dir) / (".rank-" + std::to_string(rank) + ".tmp");
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << mine;
      TANDEM_CHECK_MSG(out.good(), IoError, "rendezvous: cannot write " << tmp.string());
    }
    fs::rename(tmp, final_path);
    std::vector<std::string> all(static_cast<size_t>(size));
    std::vector<bool> have(static_cast<size_t>(size), false);
    const auto deadline = Clock::now() + timeout;
    for (int found = 0; found < size;) {
      for (int r = 0; r < size; ++r) {
        if (have[static_cast<size_t>(r)]) continue;
        std::ifstream in(fs::path(dir) / ("rank-" + std::to_string(r)));
        if (!in) continue;
        std::stringstream text;
        text << in.rdbuf();
        all[static_cast<size_t>(r)] = text.str();
        have[static_cast<size_t>(r)] = true;
        ++found;
      }
      if (found == size) break;
      if (Clock::now() > deadline) {
        std::string missing;
        for (int r = 0; r < size; ++r)
          if (!have[static_cast<size_t>(r)]) missing.append(" ").append(std::to_string(r));
        throw Timeout(std::string("rendezvous in ").append(dir) + ": rank(s)" + missing + " of " +
                      std::to_string(size) + " did not arrive within " +
                      std::to_string(timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return all;
  };
}

}  // namespace tandem::transport
