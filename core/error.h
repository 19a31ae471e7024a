// The one error root of tandem and the check macros that raise it.
//
// Every failure that a caller might handle is a tandem::Error. Subclasses exist only
// where callers catch them separately. Checks never compile away: data that reaches
// them may come from files or peers.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A caller passed a value that is not acceptable (CLI flag, YAML field, API argument).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A file or message does not follow its format (model file, IDX file, YAML syntax).
class FormatError : public Error {
 public:
  using Error::Error;
};

// Reading or writing a file or socket failed; the message names the path or peer.
class IoError : public Error {
 public:
  using Error::Error;
};

class Timeout : public Error {
 public:
  using Error::Error;
};

// A device call failed; the message carries the device's own error name.
class DeviceError : public Error {
 public:
  using Error::Error;
};

// The user stopped the work (SIGINT, SIGTERM): what was started has been stopped. The
// CLI exits 130 on it.
class Interrupted : public Error {
 public:
  using Error::Error;
};

// The request is valid but this build or device does not support it.
class Unsupported : public Error {
 public:
  using Error::Error;
};

namespace detail {

// Formats "expr (a vs b) at file:line: extra" for a failed comparison.
template <typename A, typename B>
std::string checkMessage(const char* expr, const A& a, const B& b, const char* file, int line) {
  std::ostringstream os;
  os << expr << " (" << a << " vs " << b << ") at " << file << ":" << line;
  return os.str();
}

std::string checkMessage(const char* expr, const char* file, int line);

}  // namespace detail
}  // namespace tandem

// TANDEM_CHECK(cond) << nothing; use TANDEM_CHECK_MSG to add context.
#define TANDEM_CHECK(cond)                                                                         \
  do {                                                                                             \
    if (!(cond)) throw ::tandem::Error(::tandem::detail::checkMessage(#cond, __FILE__, __LINE__)); \
  } while (0)

#define TANDEM_CHECK_MSG(cond, ErrorType, msg) \
  do {                                         \
    if (!(cond)) {                             \
      std::ostringstream tandem_check_os_;     \
      tandem_check_os_ << msg;                 \
      throw ErrorType(tandem_check_os_.str()); \
    }                                          \
  } while (0)

#define TANDEM_CHECK_OP_(a, b, op)                                                          \
  do {                                                                                      \
    const auto& tandem_a_ = (a);                                                            \
    const auto& tandem_b_ = (b);                                                            \
    if (!(tandem_a_ op tandem_b_))                                                          \
      throw ::tandem::Error(::tandem::detail::checkMessage(#a " " #op " " #b, tandem_a_,    \
                                                           tandem_b_, __FILE__, __LINE__)); \
  } while (0)

#define TANDEM_CHECK_EQ(a, b) TANDEM_CHECK_OP_(a, b, ==)
#define TANDEM_CHECK_NE(a, b) TANDEM_CHECK_OP_(a, b, !=)
#define TANDEM_CHECK_LT(a, b) TANDEM_CHECK_OP_(a, b, <)
#define TANDEM_CHECK_LE(a, b) TANDEM_CHECK_OP_(a, b, <=)
#define TANDEM_CHECK_GT(a, b) TANDEM_CHECK_OP_(a, b, >)
#define TANDEM_CHECK_GE(a, b) TANDEM_CHECK_OP_(a, b, >=)
