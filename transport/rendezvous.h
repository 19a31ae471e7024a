// How the ranks of a cross-process group find each other: each publishes one string
// (its endpoints) and learns everyone's.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace tandem::transport {

// Gives this rank's string to the others and returns every rank's, in rank order.
using Exchange = std::function<std::vector<std::string>(const std::string& mine)>;

// Through files `dir`/rank-N (written whole, then renamed into place); Timeout naming the
// ranks whose file did not appear within `timeout`. The directory must be fresh for each
// group.
Exchange fileExchange(const std::string& dir, int rank, int size,
                      std::chrono::milliseconds timeout);

}  // namespace tandem::transport
