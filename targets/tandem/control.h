// The control channel between `tandem profile --links` and its link agents (links.h):
// JSON messages over ZeroMQ (a PULL each side binds, a PUSH to the other's). Messages
// from a peer are hostile input: a malformed one raises FormatError naming the field.
// (`tandem run` and its stage workers speak the runtime's protocol instead,
// targets/runtime/; the link agents move to it when tandemd measures links.)
#pragma once

#include <sys/types.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "transport/context.h"

namespace tandem::cli {

using Json = nlohmann::json;

class ControlIn {
 public:
  // Binds a PULL socket on `bind` ("tcp://127.0.0.1:*").
  ControlIn(transport::Context& ctx, const std::string& bind);
  const std::string& endpoint() const { return endpoint_; }
  // The next message, or nullopt after `timeout`. FormatError if it is not a JSON object
  // with a string "type".
  std::optional<Json> recv(std::chrono::milliseconds timeout);

 private:
  zmq::socket_t socket_;
  std::string endpoint_;
};

class ControlOut {
 public:
  ControlOut(transport::Context& ctx, const std::string& connect);
  // Queues `message`; Timeout if the peer does not take it within `timeout`.
  void send(const Json& message, std::chrono::milliseconds timeout = std::chrono::seconds(10));

 private:
  zmq::socket_t socket_;
  std::string peer_;
};

// message[key] as T, or FormatError naming the message type and the key.
template <typename T>
T field(const Json& message, const char* key);

// This program (/proc/self/exe) started again as a child process with `args` after its
// name. Error if it cannot be started.
pid_t spawnSelf(const std::vector<std::string>& args);
// Stops the given child processes: SIGTERM, then SIGKILL to any still running after
// `grace`; reaps them all.
void stopChildren(const std::vector<pid_t>& pids,
                  std::chrono::milliseconds grace = std::chrono::seconds(3));

}  // namespace tandem::cli
