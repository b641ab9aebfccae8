// One message per SOCK_SEQPACKET datagram: a JSON object of at most kMaxMessageBytes, and file
// descriptors beside it (SCM_RIGHTS). Shared by the daemon and the client.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpud::io {

// Sends `message` (and `fds`); throws ProtocolError on a failed send.
void send_message(int fd, const nlohmann::json& message, const std::vector<int>& fds = {});

enum class Received { kMessage, kClosed, kTimeout, kOversized, kMalformed };
struct Incoming {
  Received what = Received::kClosed;
  nlohmann::json message;
  std::vector<int> fds;  // owned by the caller
  std::string error;     // kMalformed / kOversized: what was wrong
};
// Waits up to timeout_ns (< 0: not at all, the caller polled) for one message.
Incoming receive_message(int fd, int64_t timeout_ns);

// An error reply the peer can read before the connection closes.
nlohmann::json error_message(const std::string& text);

}  // namespace gpud::io
