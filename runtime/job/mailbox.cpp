#include "runtime/job/mailbox.h"

#include "core/error.h"

namespace tandem::runtime {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

Mailbox::Mailbox(std::vector<std::unique_ptr<Channel>>& channels, PromptSource* prompts) {
  for (size_t i = 0; i < channels.size(); ++i)
    pumps_.emplace_back([this, i, c = channels[i].get()] { pump(static_cast<int>(i), *c); });
  if (prompts) pumps_.emplace_back([this, prompts] { pumpPrompts(*prompts); });
}

Mailbox::~Mailbox() {
  stop_ = true;
  for (std::thread& t : pumps_) t.join();
}

std::optional<Mailbox::Item> Mailbox::next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !items_.empty(); })) return std::nullopt;
  Item item = std::move(items_.front());
  items_.pop_front();
  return item;
}

std::optional<std::string> Mailbox::failureOf(int slot, std::chrono::milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  while (Clock::now() < until) {
    const auto item =
        next(std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now() + 1ms));
    if (!item || item->slot != slot) continue;
    if (!item->message) return std::nullopt;  // it went without saying why
    if (const auto* f = std::get_if<Failed>(&*item->message)) return f->message;
  }
  return std::nullopt;
}

std::optional<std::pair<int, std::string>> Mailbox::causeBeside(int slot,
                                                                std::chrono::milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  while (Clock::now() < until) {
    const auto item =
        next(std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now() + 1ms));
    if (!item || item->slot == slot || item->slot < 0 || !item->message) continue;
    if (const auto* f = std::get_if<Failed>(&*item->message); f && !failedOnAPeer(f->message))
      return std::pair{item->slot, f->message};
  }
  return std::nullopt;
}

bool Mailbox::failedOnAPeer(const std::string& message) {
  return message.find("closed the connection") != std::string::npos;
}

void Mailbox::pump(int slot, Channel& c) {
  while (!stop_) {
    Item item{slot, std::nullopt, ""};
    try {
      item.message = c.recv(100ms);
      if (!item.message) continue;
    } catch (const FormatError& e) {
      item.error = std::string("sent a bad message: ") + e.what();
    } catch (const Error& e) {
      item.error = std::string("lost its connection: ") + e.what();
    }
    const bool last = !item.error.empty();
    {
      std::lock_guard lock(mu_);
      items_.push_back(std::move(item));
    }
    cv_.notify_one();
    if (last) return;
  }
}

void Mailbox::pumpPrompts(PromptSource& prompts) {
  while (!stop_) {
    std::optional<Message> m = prompts.pop(100ms);
    if (!m) continue;
    const bool last = std::holds_alternative<PromptsDone>(*m);
    {
      std::lock_guard lock(mu_);
      items_.push_back(Item{-1, std::move(m), ""});
    }
    cv_.notify_one();
    if (last) return;
  }
}

}  // namespace tandem::runtime
