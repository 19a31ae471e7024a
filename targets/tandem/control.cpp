#include "targets/tandem/control.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "core/error.h"

namespace tandem::cli {

ControlIn::ControlIn(transport::Context& ctx, const std::string& bind)
    : socket_(ctx.zmq(), zmq::socket_type::pull) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::maxmsgsize, int64_t{1} << 20);  // control messages are small
  try {
    socket_.bind(bind);
  } catch (const zmq::error_t& e) {
    throw IoError("control: cannot bind '" + bind + "': " + e.what());
  }
  endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
}

std::optional<Json> ControlIn::recv(std::chrono::milliseconds timeout) {
  socket_.set(zmq::sockopt::rcvtimeo, static_cast<int>(timeout.count()));
  zmq::message_t m;
  if (!socket_.recv(m, zmq::recv_flags::none)) return std::nullopt;
  Json j = Json::parse(m.to_string_view(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("type") || !j["type"].is_string())
    throw FormatError("control message on '" + endpoint_ +
                      "' is not a JSON object with a \"type\" string");
  return j;
}

ControlOut::ControlOut(transport::Context& ctx, const std::string& connect)
    : socket_(ctx.zmq(), zmq::socket_type::push), peer_(connect) {
  socket_.set(zmq::sockopt::linger, 2000);  // an error report must get out before exit
  try {
    socket_.connect(connect);
  } catch (const zmq::error_t& e) {
    throw IoError("control: cannot connect to '" + connect + "': " + e.what());
  }
}

void ControlOut::send(const Json& message, std::chrono::milliseconds timeout) {
  socket_.set(zmq::sockopt::sndtimeo, static_cast<int>(timeout.count()));
  const std::string text = message.dump();
  if (!socket_.send(zmq::buffer(text), zmq::send_flags::none))
    throw Timeout("control: '" + peer_ + "' did not take a message within " +
                  std::to_string(timeout.count()) + " ms");
}

template <typename T>
T field(const Json& message, const char* key) {
  const std::string type = message.value("type", std::string("?"));
  auto it = message.find(key);
  if (it == message.end())
    throw FormatError("control message '" + type + "' lacks \"" + key + "\"");
  try {
    return it->get<T>();
  } catch (const Json::exception&) {
    throw FormatError("control message '" + type + "': \"" + key + "\" has the wrong type");
  }
}

pid_t spawnSelf(const std::vector<std::string>& args) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<std::string> argv = {self};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (std::string& arg : argv) cargv.push_back(arg.data());
  cargv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw Error("cannot start a child process: fork failed");
  if (pid == 0) {
    execv(self.c_str(), cargv.data());
    _exit(127);
  }
  return pid;
}

void stopChildren(const std::vector<pid_t>& pids, std::chrono::milliseconds grace) {
  for (pid_t pid : pids) kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (pid_t pid : pids) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {  // -1: already reaped
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

template int64_t field<int64_t>(const Json&, const char*);
template double field<double>(const Json&, const char*);
template std::string field<std::string>(const Json&, const char*);

}  // namespace tandem::cli
