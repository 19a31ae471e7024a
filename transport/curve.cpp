// CurveZMQ key files and key generation.
#include "transport/curve.h"

#include <zmq.h>

#include "core/error.h"
#include "core/file.h"

namespace tandem::transport {

bool curveSupported() { return zmq_has("curve") != 0; }

CurveKeyPair generateCurveKeyPair() {
  if (!curveSupported()) throw Unsupported("this libzmq was built without CurveZMQ");
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) throw Error("zmq_curve_keypair failed");
  return {pub, sec};
}

std::string readCurveKey(const std::string& path) {
  std::string key = readFile(path, "CurveZMQ key file");
  const auto first = key.find_first_not_of(" \t\r\n");
  const auto last = key.find_last_not_of(" \t\r\n");
  key = first == std::string::npos ? "" : key.substr(first, last - first + 1);
  uint8_t binary[32];
  if (key.size() != 40 || zmq_z85_decode(binary, key.c_str()) == nullptr)
    throw InvalidArgument("CurveZMQ key file '" + path +
                          "' does not hold a 40-character Z85 key (make one with `tandem keygen`)");
  return key;
}

}  // namespace tandem::transport
