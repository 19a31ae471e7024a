// The coordinator's mailbox (coordinator.cpp): every worker's channel read by a thread of
// its own into one queue, so the coordinator waits on all of them at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/control/channel.h"
#include "runtime/job/coordinator.h"

namespace tandem::runtime {

class Mailbox {
 public:
  struct Item {
    int slot;
    std::optional<Message> message;  // empty: the channel failed, `error` says why
    std::string error;
  };

  // Items of slot -1 are the prompts of `prompts`, if given.
  Mailbox(std::vector<std::unique_ptr<Channel>>& channels, PromptSource* prompts);
  ~Mailbox();
  std::optional<Item> next(std::chrono::milliseconds timeout);

  // What worker `slot` said when it failed, if it says so within `timeout`: the channel
  // to a worker that fails breaks as it goes, and a send may see that before its
  // `failed` message is read. Other workers' items are dropped: the run is ending.
  std::optional<std::string> failureOf(int slot, std::chrono::milliseconds timeout);
  // The first other worker's `failed` message within `timeout` that is not itself a
  // consequence (failedOnAPeer), with its slot; other items are dropped: the run is ending.
  std::optional<std::pair<int, std::string>> causeBeside(int slot,
                                                         std::chrono::milliseconds timeout);
  // Whether a worker's failure says a link's peer closed the connection: what a stage whose
  // neighbour failed first reports, often before the neighbour's own report is read.
  static bool failedOnAPeer(const std::string& message);

 private:
  void pump(int slot, Channel& c);
  void pumpPrompts(PromptSource& prompts);

  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  std::vector<std::thread> pumps_;
};

}  // namespace tandem::runtime
