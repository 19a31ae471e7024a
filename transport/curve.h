// CurveZMQ key handling for encrypted, authenticated links.
#pragma once

#include <string>

namespace tandem::transport {

// A CurveZMQ key pair in Z85 text (40 characters each).
struct CurveKeyPair {
  std::string public_key, secret_key;
};
CurveKeyPair generateCurveKeyPair();
// Reads a Z85 key file (40 characters, surrounding whitespace ignored); InvalidArgument
// names the file otherwise.
std::string readCurveKey(const std::string& path);
bool curveSupported();

}  // namespace tandem::transport
