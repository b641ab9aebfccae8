// A process's side of orion-gpud: connect, hello, map the pages handed over.
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "gpud/gpud.h"
#include "shared_memory.h"
#include "socket_io.h"

namespace gpud {

namespace {

std::string no_reply(const std::filesystem::path& socket, int64_t timeout_ns) {
  return fmt::format("no reply from orion-gpud within {} ms at {}: is it running/hung? (`orion-gpud status` asks "
                     "it; restart it if that does not answer either)",
                     timeout_ns / 1'000'000, socket.string());
}

// Waits up to wait_ns for the reply (timeout_ns: the caller's whole bound, for the message).
// Descriptors that came with the reply go to *fds (the caller closes them, on error too).
nlohmann::json expect_reply(int fd, const std::filesystem::path& socket, const char* type, int64_t wait_ns,
                            int64_t timeout_ns, std::vector<int>* fds) {
  io::Incoming in = io::receive_message(fd, wait_ns, kMaxReplyBytes);
  if (fds != nullptr) {
    *fds = std::move(in.fds);
  } else {
    for (int f : in.fds) close(f);
  }
  switch (in.what) {
    case io::Received::kTimeout:
      throw ProtocolError(no_reply(socket, timeout_ns));
    case io::Received::kClosed:
      throw ProtocolError("orion-gpud closed the connection at " + socket.string());
    case io::Received::kOversized:
    case io::Received::kMalformed:
      throw ProtocolError("orion-gpud sent " + in.error);
    case io::Received::kMessage:
      break;
  }
  const std::string got = in.message["type"].get<std::string>();
  if (got == "error") throw ProtocolError("orion-gpud refused: " + in.message.value("error", std::string("(no reason)")));
  if (got != type) throw ProtocolError(fmt::format("orion-gpud answered '{}', expected '{}'", got, type));
  return in.message;
}

// Sends on `fd` give up after timeout_ns (EAGAIN), and so does the connect when the daemon's
// backlog is full (a hung daemon that accepts nothing): a Unix socket's connect waits SO_SNDTIMEO.
void bound_sends(int fd, int64_t timeout_ns) {
  const int64_t us = std::max<int64_t>(timeout_ns / 1'000, 1);
  const timeval tv{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
  if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
    throw ProtocolError(fmt::format("setsockopt(SO_SNDTIMEO): {}", std::strerror(errno)));
  }
}

// Only a daemon of our own uid or root may hand us pages: anyone else who could bind the socket
// path (another user's folder given by mistake) could feed us windows and grants.
void check_daemon_uid(int fd, const std::filesystem::path& socket) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    throw ProtocolError(fmt::format("cannot tell who serves {} (SO_PEERCRED: {})", socket.string(),
                                    std::strerror(errno)));
  }
  const uid_t own = geteuid();
  if (cred.uid != own && cred.uid != 0) {
    throw ProtocolError(fmt::format(
        "the orion-gpud at {} (pid {}) runs as uid {}, neither this process's uid {} nor root: not trusted. Start "
        "an orion-gpud of your own in a folder of your own (--dir / ORION_GPUD_DIR, the same folder here), or have "
        "the shared one run as root with --allow-uid {}",
        socket.string(), cred.pid, cred.uid, own, own));
  }
}

}  // namespace

Client Client::connect(const std::filesystem::path& dir, const std::string& gpu, Role role, const std::string& name,
                       int64_t timeout_ns) {
  const int64_t deadline = monotonic_ns() + timeout_ns;
  const std::filesystem::path path = socket_path(dir, gpu);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.string().size() >= sizeof addr.sun_path) throw ProtocolError("socket path too long: " + path.string());
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  Client c;
  c.role_ = role;
  c.socket_ = path;
  c.fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (c.fd_ < 0) throw ProtocolError(fmt::format("socket: {}", std::strerror(errno)));
  bound_sends(c.fd_, timeout_ns);
  int rc;
  while ((rc = ::connect(c.fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr)) != 0 && errno == EINTR &&
         monotonic_ns() < deadline) {
  }
  if (rc != 0) {
    if (errno == EAGAIN || errno == EINTR) throw ProtocolError(no_reply(path, timeout_ns));
    throw ProtocolError(fmt::format("no orion-gpud for GPU {} at {} ({}): start one with `orion-gpud serve --gpu {}`",
                                    gpu, path.string(), std::strerror(errno), gpu));
  }
  check_daemon_uid(c.fd_, path);
  // The hello's send gets what is left of the bound, not a bound of its own ("in all").
  const int64_t left_ns = deadline - monotonic_ns();
  if (left_ns <= 0) throw ProtocolError(no_reply(path, timeout_ns));
  bound_sends(c.fd_, left_ns);
  try {
    io::send_message(c.fd_, {{"type", "hello"},
                             {"version", kProtocolVersion},
                             {"role", to_string(role)},
                             {"pid", static_cast<int64_t>(getpid())},
                             {"name", name}});
  } catch (const io::SendTimeout&) {
    throw ProtocolError(no_reply(path, timeout_ns));  // its queue stayed full
  }
  bound_sends(c.fd_, timeout_ns);  // later sends (status, bye) get the whole bound again
  std::vector<int> fds;
  nlohmann::json welcome;
  try {
    welcome = expect_reply(c.fd_, path, "welcome", std::max<int64_t>(deadline - monotonic_ns(), 0), timeout_ns, &fds);
  } catch (...) {
    for (int f : fds) close(f);
    throw;
  }
  const size_t want = role == Role::kPipeline ? 1 : role == Role::kBestEffort ? 3 : 0;
  try {
    if (fds.size() != want) throw ProtocolError(fmt::format("orion-gpud handed over {} pages, expected {}", fds.size(), want));
    c.id_ = welcome.value("client_id", 0);
    if (role != Role::kObserver) {
      c.pipeline_ = static_cast<PipelinePage*>(map_received_page(fds[0], role == Role::kPipeline));
    }
    if (role == Role::kBestEffort) {
      c.grant_ = static_cast<GrantPage*>(map_received_page(fds[1], false));
      c.usage_ = static_cast<UsagePage*>(map_received_page(fds[2], true));
    }
  } catch (...) {
    for (int f : fds) close(f);
    throw;
  }
  for (int f : fds) close(f);  // the mappings stay
  return c;
}

Client::Client(Client&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), socket_(std::move(o.socket_)), id_(o.id_), role_(o.role_),
      pipeline_(std::exchange(o.pipeline_, nullptr)), grant_(std::exchange(o.grant_, nullptr)),
      usage_(std::exchange(o.usage_, nullptr)), requests_(o.requests_) {}

Client& Client::operator=(Client&& o) noexcept {
  if (this != &o) {
    this->~Client();
    fd_ = std::exchange(o.fd_, -1);
    socket_ = std::move(o.socket_);
    id_ = o.id_;
    role_ = o.role_;
    pipeline_ = std::exchange(o.pipeline_, nullptr);
    grant_ = std::exchange(o.grant_, nullptr);
    usage_ = std::exchange(o.usage_, nullptr);
    requests_ = o.requests_;
  }
  return *this;
}

Client::~Client() {
  unmap_page(pipeline_);
  unmap_page(grant_);
  unmap_page(usage_);
  if (fd_ >= 0) close(fd_);
}

const PipelinePage& Client::pipeline() const {
  if (pipeline_ == nullptr) throw std::logic_error("an observer has no pipeline page: it asks for status()");
  return *pipeline_;
}

PipelinePage& Client::pipeline_writable() {
  if (role_ != Role::kPipeline) throw std::logic_error("only the pipeline client writes the pipeline page");
  return *pipeline_;
}

const GrantPage& Client::grant() const {
  if (grant_ == nullptr) throw std::logic_error("only a best-effort client has a grant");
  return *grant_;
}

UsagePage& Client::usage() {
  if (usage_ == nullptr) throw std::logic_error("only a best-effort client has a usage page");
  return *usage_;
}

nlohmann::json Client::status(int64_t timeout_ns) {
  const int64_t deadline = monotonic_ns() + timeout_ns;
  const uint64_t request = ++requests_;
  // This call's bound, not connect's: a daemon that stopped reading fills the queue, and the
  // send then waits for room at most this long.
  bound_sends(fd_, timeout_ns);
  try {
    io::send_message(fd_, {{"type", "status"}, {"request", request}});
  } catch (const io::SendTimeout&) {
    throw ProtocolError(no_reply(socket_, timeout_ns));
  }
  for (;;) {
    nlohmann::json reply =
        expect_reply(fd_, socket_, "status", std::max<int64_t>(deadline - monotonic_ns(), 0), timeout_ns, nullptr);
    const auto r = reply.find("request");
    if (r == reply.end() || !r->is_number_unsigned()) {
      throw ProtocolError("orion-gpud sent a status reply without its request's number");
    }
    if (r->get<uint64_t>() == request) return reply;
    // An earlier request's reply that came after its caller gave up: not this one's.
  }
}

void Client::close_connection() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

bool Client::daemon_alive() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  int rc;
  do {
    rc = poll(&p, 1, 0);
  } while (rc < 0 && errno == EINTR);
  // A message waiting (POLLIN alone) is no hang-up; the daemon's close sets POLLHUP and POLLRDHUP.
  return rc <= 0 || (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) == 0;
}

}  // namespace gpud
