// A process's side of orion-gpud: connect, hello, map the pages handed over.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "gpud/gpud.h"
#include "shared_memory.h"
#include "socket_io.h"

namespace gpud {

namespace {

// Descriptors that came with the reply go to *fds (the caller closes them, on error too).
nlohmann::json expect_reply(int fd, const char* type, int64_t timeout_ns, std::vector<int>* fds) {
  io::Incoming in = io::receive_message(fd, timeout_ns);
  if (fds != nullptr) {
    *fds = std::move(in.fds);
  } else {
    for (int f : in.fds) close(f);
  }
  switch (in.what) {
    case io::Received::kTimeout:
      throw ProtocolError(fmt::format("orion-gpud did not answer within {} ms", timeout_ns / 1'000'000));
    case io::Received::kClosed:
      throw ProtocolError("orion-gpud closed the connection");
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

}  // namespace

Client Client::connect(const std::filesystem::path& dir, const std::string& gpu, Role role, const std::string& name,
                       int64_t timeout_ns) {
  const std::filesystem::path path = socket_path(dir, gpu);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.string().size() >= sizeof addr.sun_path) throw ProtocolError("socket path too long: " + path.string());
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  Client c;
  c.role_ = role;
  c.fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (c.fd_ < 0) throw ProtocolError(fmt::format("socket: {}", std::strerror(errno)));
  if (::connect(c.fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    throw ProtocolError(fmt::format("no orion-gpud for GPU {} at {} ({}): start one with `orion-gpud serve --gpu {}`",
                                    gpu, path.string(), std::strerror(errno), gpu));
  }
  io::send_message(c.fd_, {{"type", "hello"},
                           {"version", kProtocolVersion},
                           {"role", to_string(role)},
                           {"pid", static_cast<int64_t>(getpid())},
                           {"name", name}});
  std::vector<int> fds;
  nlohmann::json welcome;
  try {
    welcome = expect_reply(c.fd_, "welcome", timeout_ns, &fds);
  } catch (...) {
    for (int f : fds) close(f);
    throw;
  }
  const size_t want = role == Role::kPipeline ? 1 : 2;
  try {
    if (fds.size() != want) throw ProtocolError(fmt::format("orion-gpud handed over {} pages, expected {}", fds.size(), want));
    c.id_ = welcome.value("client_id", 0);
    c.pipeline_ = static_cast<PipelinePage*>(map_received_page(fds[0], role == Role::kPipeline));
    if (role == Role::kBestEffort) c.grant_ = static_cast<GrantPage*>(map_received_page(fds[1], false));
  } catch (...) {
    for (int f : fds) close(f);
    throw;
  }
  for (int f : fds) close(f);  // the mappings stay
  return c;
}

Client::Client(Client&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), id_(o.id_), role_(o.role_), pipeline_(std::exchange(o.pipeline_, nullptr)),
      grant_(std::exchange(o.grant_, nullptr)) {}

Client& Client::operator=(Client&& o) noexcept {
  if (this != &o) {
    this->~Client();
    fd_ = std::exchange(o.fd_, -1);
    id_ = o.id_;
    role_ = o.role_;
    pipeline_ = std::exchange(o.pipeline_, nullptr);
    grant_ = std::exchange(o.grant_, nullptr);
  }
  return *this;
}

Client::~Client() {
  unmap_page(pipeline_);
  unmap_page(grant_);
  if (fd_ >= 0) close(fd_);
}

PipelinePage& Client::pipeline_writable() {
  if (role_ != Role::kPipeline) throw std::logic_error("only the pipeline client writes the pipeline page");
  return *pipeline_;
}

const GrantPage& Client::grant() const {
  if (grant_ == nullptr) throw std::logic_error("only a best-effort client has a grant");
  return *grant_;
}

nlohmann::json Client::status(int64_t timeout_ns) {
  io::send_message(fd_, {{"type", "status"}});
  return expect_reply(fd_, "status", timeout_ns, nullptr);
}

}  // namespace gpud
