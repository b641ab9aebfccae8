#include "socket_io.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "gpud/gpud.h"

namespace gpud::io {

namespace {
constexpr size_t kMaxFds = 4;
}

void send_message(int fd, const nlohmann::json& message, const std::vector<int>& fds, size_t max_bytes) {
  const std::string text = message.dump();
  if (text.size() > max_bytes) {
    throw ProtocolError(fmt::format("message of {} bytes too large to send (at most {})", text.size(), max_bytes));
  }
  if (fds.size() > kMaxFds) throw ProtocolError("too many descriptors in one message");
  iovec iov{const_cast<char*>(text.data()), text.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  // A blocking socket's send waits at most its SO_SNDTIMEO; a signal (SIGPROF, SIGCHLD) makes
  // sendmsg return EINTR, and a plain retry would wait the whole bound again (never ending under
  // signals more frequent than it). Each retry gets what is left of the bound, read only once a
  // signal came (the common send costs no extra system call).
  const int64_t start = monotonic_ns();
  timeval bound{};
  bool have_bound = false, shortened = false;
  ssize_t n;
  while ((n = sendmsg(fd, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
    if (!have_bound) {
      socklen_t len = sizeof bound;
      have_bound = getsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &bound, &len) == 0 && (bound.tv_sec != 0 || bound.tv_usec != 0);
      if (!have_bound) continue;  // unbounded: a retry waits as the first send did
    }
    const int64_t left_us =
        (static_cast<int64_t>(bound.tv_sec) * 1'000'000 + bound.tv_usec) - (monotonic_ns() - start) / 1'000;
    if (left_us <= 0) {
      errno = EAGAIN;
      break;
    }
    const timeval rest{static_cast<time_t>(left_us / 1'000'000), static_cast<suseconds_t>(left_us % 1'000'000)};
    if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &rest, sizeof rest) == 0) shortened = true;
  }
  const int saved_errno = errno;
  if (shortened) setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &bound, sizeof bound);
  errno = saved_errno;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) throw SendTimeout("send timed out");
  if (n < 0) throw ProtocolError(fmt::format("send failed: {}", std::strerror(errno)));
}

Incoming receive_message(int fd, int64_t timeout_ns, size_t max_bytes, bool accept_fds) {
  Incoming in;
  if (timeout_ns >= 0) {
    pollfd p{fd, POLLIN, 0};
    int rc;
    // One deadline for the whole wait: a signal (SIGPROF, SIGCHLD) restarting poll must not
    // restart the full timeout each time, or frequent signals make the wait unbounded.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
    do {
      const int64_t left_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  deadline - std::chrono::steady_clock::now()).count();
      const int64_t ms = std::clamp<int64_t>(left_ns / 1'000'000 + 1, 0, 24 * 3600 * 1000);  // no overflow
      rc = poll(&p, 1, left_ns <= 0 ? 0 : static_cast<int>(ms));
    } while (rc < 0 && errno == EINTR);
    if (rc == 0) {
      in.what = Received::kTimeout;
      return in;
    }
  }
  // One byte more than allowed: a longer datagram is truncated (MSG_TRUNC), one of exactly that
  // length is caught by the size check below.
  std::string buffer(max_bytes + 1, '\0');
  iovec iov{buffer.data(), buffer.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (accept_fds) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  ssize_t n;
  do {
    n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        in.fds.push_back(received);
      }
    }
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    in.what = Received::kTimeout;
    return in;
  }
  if (n <= 0) {
    in.what = Received::kClosed;
    return in;
  }
  if (!accept_fds && (msg.msg_flags & MSG_CTRUNC)) {
    in.what = Received::kMalformed;
    in.error = "a message with descriptors attached (clients send none)";
    return in;
  }
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || static_cast<size_t>(n) > max_bytes) {
    in.what = Received::kOversized;
    in.error = fmt::format("message over {} bytes or with too many descriptors", max_bytes);
    return in;
  }
  in.message = nlohmann::json::parse(buffer.data(), buffer.data() + n, nullptr, /*allow_exceptions=*/false);
  if (in.message.is_discarded() || !in.message.is_object() || !in.message.contains("type") ||
      !in.message["type"].is_string()) {
    in.what = Received::kMalformed;
    in.error = "not a JSON object with a string 'type'";
    return in;
  }
  in.what = Received::kMessage;
  return in;
}

nlohmann::json error_message(const std::string& text) { return {{"type", "error"}, {"error", text}}; }

}  // namespace gpud::io
