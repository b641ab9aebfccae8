// One message per SOCK_SEQPACKET datagram: a JSON object of at most max_bytes (kMaxMessageBytes
// from a client, kMaxReplyBytes from the daemon), and file descriptors beside it (SCM_RIGHTS).
// Shared by the daemon and the client.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpud/gpud.h"

namespace gpud::io {

// A send that waited its socket's SO_SNDTIMEO out (the peer's queue stayed full).
struct SendTimeout : ProtocolError {
  using ProtocolError::ProtocolError;
};

// Sends `message` (and `fds`); throws ProtocolError on a failed send or a message over max_bytes,
// SendTimeout when the socket's send timeout ran out.
void send_message(int fd, const nlohmann::json& message, const std::vector<int>& fds = {},
                  size_t max_bytes = kMaxMessageBytes);

enum class Received { kMessage, kClosed, kTimeout, kOversized, kMalformed };
struct Incoming {
  Received what = Received::kClosed;
  nlohmann::json message;
  std::vector<int> fds;  // owned by the caller
  std::string error;     // kMalformed / kOversized: what was wrong
};
// Waits up to timeout_ns (< 0: not at all, the caller polled) for one message of at most
// max_bytes (a longer one is kOversized). Without `accept_fds` (the daemon: clients send none)
// the message is read with no control buffer, so descriptors a peer attached never become this
// process's: the kernel drops them (an fput, no flush), where a close() here would run the
// file's flush, which a FUSE server can hold forever; such a message is kMalformed.
Incoming receive_message(int fd, int64_t timeout_ns, size_t max_bytes = kMaxMessageBytes, bool accept_fds = true);

// An error reply the peer can read before the connection closes.
nlohmann::json error_message(const std::string& text);

}  // namespace gpud::io
