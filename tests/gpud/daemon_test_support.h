// What the orion-gpud server tests share: a test daemon's options, a raw connection to say what
// a well-behaved client would not, a bounded wait. For daemon_test.cpp (the server in process),
// client_test.cpp (a client facing a hung, gone or foreign daemon) and daemon_process_test.cpp
// (each party a separate process, killed for real).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpud/gpud.h"
#include "in_process_daemon.h"

namespace gpud::daemon_test {

namespace fs = std::filesystem;
using ::gpud::testing::DaemonThread;
using ::gpud::testing::TempDir;
constexpr int64_t kMs = 1'000'000;
constexpr const char* kGpu = "GPU-test-0";

// Polls `cond` until it holds or `timeout_ms` passed: generous, since it returns as soon as it
// holds, and a sanitizer build on a loaded 2-core machine may take seconds to start a process.
inline bool eventually(const std::function<bool()>& cond, int64_t timeout_ms = 10'000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return cond();
}

inline DaemonOptions test_options(const fs::path& dir) {
  DaemonOptions o;
  o.gpu = kGpu;
  o.dir = dir;
  o.grants = {.lease_ns = 150 * kMs, .stale_after_ns = 60 * kMs, .inflight_budget_ns = 2 * kMs};
  o.tick_ns = 5 * kMs;
  o.hello_timeout_ns = 200 * kMs;
  return o;
}

inline sockaddr_un address_of(const fs::path& dir) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path(dir, kGpu).c_str(), sizeof addr.sun_path - 1);
  return addr;
}

// A raw connection, to say what a well-behaved client would not.
// A message of `size` bytes with room for one descriptor (SCM_RIGHTS), for sendmsg/recvmsg.
struct OneFdMessage {
  iovec iov;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  OneFdMessage(void* bytes, size_t size) : iov{bytes, size} {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  OneFdMessage(const OneFdMessage&) = delete;  // msg points into itself
  OneFdMessage& operator=(const OneFdMessage&) = delete;
};

// Sends `bytes` with descriptor `fd` attached. Syscalls only: safe in a forked child of a threaded
// process.
inline ssize_t send_with_fd(int sock, const void* bytes, size_t size, int fd, int flags = MSG_NOSIGNAL) {
  OneFdMessage m(const_cast<void*>(bytes), size);
  cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return sendmsg(sock, &m.msg, flags);
}

// The descriptor a one-byte message on `sock` carries, or -1.
inline int receive_fd(int sock) {
  char byte = 0;
  OneFdMessage m(&byte, 1);
  if (recvmsg(sock, &m.msg, MSG_CMSG_CLOEXEC) != 1) return -1;
  const cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

struct Raw {
  int fd = -1;
  explicit Raw(const fs::path& dir) {
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    const sockaddr_un addr = address_of(dir);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      ADD_FAILURE() << "connect: " << std::strerror(errno);
    }
  }
  // A connection made elsewhere (handed over SCM_RIGHTS), owned from now on.
  explicit Raw(int adopted) : fd(adopted) {}
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;
  ~Raw() { close(fd); }
  void send(const std::string& bytes) const { ASSERT_GE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), 0); }
  // For the fuzz: the daemon may already have closed the connection.
  void send_quietly(const std::string& bytes) const { (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL); }
  // The reply's text ("" when the daemon closed without one), and its descriptors.
  std::string reply(std::vector<int>* fds = nullptr, int timeout_ms = 10000) const {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return "<no reply>";
    char buf[kMaxMessageBytes + 1];
    iovec iov{buf, sizeof buf};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int got;
        std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (fds != nullptr) fds->push_back(got); else close(got);
      }
    }
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }
  bool closed_by_peer() const {
    char b;
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, 10000) > 0 && recv(fd, &b, 1, MSG_DONTWAIT) == 0;
  }
};

inline std::string hello(const char* role, int64_t pid = getpid(), uint64_t version = kProtocolVersion) {
  return nlohmann::json{{"type", "hello"}, {"version", version}, {"role", role}, {"pid", pid}, {"name", "t"}}.dump();
}

inline size_t clients_with_role(Client& c, const char* role) {
  const nlohmann::json status = c.status();
  size_t n = 0;
  for (const auto& j : status.at("clients")) n += j.at("role") == role;
  return n;
}

}  // namespace gpud::daemon_test
