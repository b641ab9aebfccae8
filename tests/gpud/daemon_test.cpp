// orion-gpud as a server: the hello and the pages it hands over, every refusal (version, uid,
// malformed, oversized, silent, second pipeline, second daemon), a fuzzed protocol, and killing
// each party for real (separate processes: the daemon binary and gpud_test_client).
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

extern char** environ;

namespace gpud {
namespace {

namespace fs = std::filesystem;
using testing::DaemonThread;
using testing::TempDir;
constexpr int64_t kMs = 1'000'000;
constexpr const char* kGpu = "GPU-test-0";

bool eventually(const std::function<bool()>& cond, int64_t timeout_ms = 3000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return cond();
}

DaemonOptions test_options(const fs::path& dir) {
  DaemonOptions o;
  o.gpu = kGpu;
  o.dir = dir;
  o.grants = {.lease_ns = 150 * kMs, .stale_after_ns = 60 * kMs, .inflight_budget_ns = 2 * kMs};
  o.tick_ns = 5 * kMs;
  o.hello_timeout_ns = 200 * kMs;
  return o;
}

sockaddr_un address_of(const fs::path& dir) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path(dir, kGpu).c_str(), sizeof addr.sun_path - 1);
  return addr;
}

// A raw connection, to say what a well-behaved client would not.
struct Raw {
  int fd = -1;
  explicit Raw(const fs::path& dir) {
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    const sockaddr_un addr = address_of(dir);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      ADD_FAILURE() << "connect: " << std::strerror(errno);
    }
  }
  ~Raw() { close(fd); }
  void send(const std::string& bytes) const { ASSERT_GE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), 0); }
  // For the fuzz: the daemon may already have closed the connection.
  void send_quietly(const std::string& bytes) const { (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL); }
  // The reply's text ("" when the daemon closed without one), and its descriptors.
  std::string reply(std::vector<int>* fds = nullptr, int timeout_ms = 2000) const {
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
    return poll(&p, 1, 2000) > 0 && recv(fd, &b, 1, MSG_DONTWAIT) == 0;
  }
};

std::string hello(const char* role, int64_t pid = getpid(), uint64_t version = kProtocolVersion) {
  return nlohmann::json{{"type", "hello"}, {"version", version}, {"role", role}, {"pid", pid}, {"name", "t"}}.dump();
}

size_t clients_with_role(Client& c, const char* role) {
  const nlohmann::json status = c.status();
  size_t n = 0;
  for (const auto& j : status.at("clients")) n += j.at("role") == role;
  return n;
}

TEST(GpudDaemon, APipelineAndABestEffortClientShareTheWindowAndTheGrant) {
  TempDir dir;
  DaemonThread d(test_options(dir.path));
  Client pipeline = Client::connect(dir.path, kGpu, Role::kPipeline, "gpipe_runner");
  Client be = Client::connect(dir.path, kGpu, Role::kBestEffort, "eval");
  // No heartbeat yet: best effort runs freely.
  ASSERT_TRUE(eventually([&] { return read_grant(be.grant()).mode == GrantMode::kFree; }));
  const int64_t now = monotonic_ns();
  heartbeat(pipeline.pipeline_writable(), now);
  publish_window(pipeline.pipeline_writable(), now + 1 * kMs, now + 9 * kMs);
  ASSERT_TRUE(eventually([&] {
    heartbeat(pipeline.pipeline_writable(), monotonic_ns());
    return read_grant(be.grant()).mode == GrantMode::kGated;
  }));
  const WindowView w = read_window(be.pipeline());
  EXPECT_EQ(w.open_ns, now + 1 * kMs);
  EXPECT_EQ(w.close_ns, now + 9 * kMs);
  EXPECT_EQ(w.windows_published, 1u);
  EXPECT_EQ(read_grant(be.grant()).inflight_budget_ns, 2 * kMs);
  // The lease keeps being renewed while the daemon lives.
  const int64_t first = read_grant(be.grant()).lease_expiry_ns;
  ASSERT_TRUE(eventually([&] { return read_grant(be.grant()).lease_expiry_ns > first + 20 * kMs; }));
  // The pipeline stops heartbeating: stale after 60 ms, the grant goes free.
  ASSERT_TRUE(eventually([&] { return read_grant(be.grant()).mode == GrantMode::kFree; }, 1000));
  // Bubbles filled: the client's admitted work against the idle time offered (8 ms, then the
  // same window cut to 4 ms by the pipeline's demand).
  publish_window(pipeline.pipeline_writable(), now + 1 * kMs, now + 5 * kMs);
  record_admitted(be.usage(), 1 * kMs);
  record_admitted(be.usage(), -1);  // unknown length: a launch, no time
  const nlohmann::json s = be.status();
  EXPECT_EQ(s["gpu"], kGpu);
  EXPECT_EQ(s["clients"].size(), 2u);
  EXPECT_EQ(s["pipeline"]["windows_published"], 2);
  EXPECT_DOUBLE_EQ(s["pipeline"]["window_ms_published"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(s["pipeline"]["filled_share"].get<double>(), 0.25);
  bool found = false;
  for (const auto& c : s["clients"]) {
    if (c["role"] != "best_effort") continue;
    found = true;
    EXPECT_EQ(c["launches_admitted"], 2);
    EXPECT_DOUBLE_EQ(c["admitted_kernel_ms"].get<double>(), 1.0);
  }
  EXPECT_TRUE(found);
}

TEST(GpudDaemon, BestEffortClientsGetReadOnlyPages) {
  TempDir dir;
  DaemonThread d(test_options(dir.path));
  Raw raw(dir.path);
  raw.send(hello("best_effort"));
  std::vector<int> fds;
  const std::string welcome = raw.reply(&fds);
  ASSERT_NE(welcome.find("\"welcome\""), std::string::npos) << welcome;
  ASSERT_EQ(fds.size(), 3u) << "the pipeline page, the grant, the client's own usage page";
  // fds[2], the usage page, is the client's to write (its admitted launches); only it. It cannot
  // seal the page (F_SEAL_SEAL is set), which would lock the daemon's next client out.
  EXPECT_EQ(fcntl(fds[2], F_GETFL) & O_ACCMODE, O_RDWR);
  EXPECT_NE(fcntl(fds[2], F_GET_SEALS) & F_SEAL_SEAL, 0);
  EXPECT_EQ(fcntl(fds[2], F_ADD_SEALS, F_SEAL_FUTURE_WRITE), -1);
  EXPECT_EQ(errno, EPERM);
  close(fds[2]);
  fds.pop_back();
  // fds[1], the grant, is sealed against writes: a read-write reopen through /proc (which root
  // can make despite the 0400 mode) still cannot map it writable.
  const int reopened = open(("/proc/self/fd/" + std::to_string(fds[1])).c_str(), O_RDWR | O_CLOEXEC);
  if (reopened >= 0) {
    EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, reopened, 0), MAP_FAILED);
    EXPECT_EQ(errno, EPERM);
    close(reopened);
  } else {
    EXPECT_EQ(errno, EACCES);
  }
  for (int fd : fds) {
    EXPECT_EQ(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
    EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
    EXPECT_EQ(errno, EACCES);
    // Reopening the memfd read-write through /proc is refused by its mode to anyone but root.
    struct stat st {};
    ASSERT_EQ(fstat(fd, &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0400u);
    EXPECT_NE(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK, 0);  // the daemon's mapping cannot shrink
    close(fd);
  }
}

// The pipeline gets the page's read-write descriptor; with it, it could add F_SEAL_FUTURE_WRITE
// and every later pipeline's writable mapping would fail (EPERM) until the daemon restarts. The
// page's seals are sealed, so it cannot; and a header it scribbled over is rewritten when it
// leaves.
TEST(GpudDaemon, APipelineCannotLockTheNextPipelineOutOfItsPage) {
  TempDir dir;
  DaemonThread d(test_options(dir.path));
  {
    Raw raw(dir.path);
    raw.send(hello("pipeline"));
    std::vector<int> fds;
    const std::string welcome = raw.reply(&fds);
    ASSERT_NE(welcome.find("\"welcome\""), std::string::npos) << welcome;
    ASSERT_FALSE(fds.empty());
    const int fd = fds[0];  // the pipeline page, read-write
    ASSERT_EQ(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDWR);
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), -1);
    EXPECT_EQ(errno, EPERM);
    void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(page, MAP_FAILED);
    static_cast<PipelinePage*>(page)->magic = 0;  // scribbled over
    munmap(page, 4096);
    for (int f : fds) close(f);
  }  // the connection closes: the pipeline left
  ASSERT_TRUE(eventually([&] {
    try {
      Client next = Client::connect(dir.path, kGpu, Role::kPipeline, "gpipe_runner");
      publish_window(next.pipeline_writable(), 1, 2);
      return read_window(next.pipeline()).windows_published == 1;
    } catch (const std::exception&) {
      return false;  // until the daemon saw the first one go
    }
  }));
}

// A client in another PID namespace (a container) knows itself by another pid than the socket
// says: welcomed, and watched by the socket's pid.
TEST(GpudDaemon, AClientInAnotherPidNamespaceIsWelcomed) {
  TempDir dir;
  DaemonThread d(test_options(dir.path));
  Raw raw(dir.path);
  raw.send(hello("best_effort", 7));  // what getpid() says inside a container
  std::vector<int> fds;
  const std::string reply = raw.reply(&fds);
  for (int fd : fds) close(fd);
  EXPECT_NE(reply.find("\"welcome\""), std::string::npos) << reply;
}

TEST(GpudDaemon, EveryBadHelloIsRefusedWithItsReasonAndTheDaemonCarriesOn) {
  TempDir dir;
  DaemonThread d(test_options(dir.path));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {hello("pipeline", getpid(), 99), "protocol version 99, this orion-gpud speaks " + std::to_string(kProtocolVersion)},
      {hello("spectator"), "unknown role 'spectator' (pipeline, best_effort or observer)"},
      {hello("pipeline", -5), "the sender's pid (a positive integer)"},
      {nlohmann::json{{"type", "hello"}, {"version", kProtocolVersion}, {"role", "pipeline"}, {"pid", getpid()}, {"name", 7}}.dump(),
       "a 'name' of at most 64 characters"},
      {"{not json", "not a JSON object"},
      {R"(["hello"])", "not a JSON object"},
      {R"({"type":"status"})", "the first message must be a hello"},
      {std::string(kMaxMessageBytes + 100, 'x'), "message over 4096 bytes"},
  };
  for (const auto& [message, why] : cases) {
    Raw raw(dir.path);
    raw.send(message);
    const std::string reply = raw.reply();
    EXPECT_NE(reply.find("\"error\""), std::string::npos) << message.substr(0, 60) << " -> " << reply;
    EXPECT_NE(reply.find(why), std::string::npos) << message.substr(0, 60) << " -> " << reply;
    EXPECT_TRUE(raw.closed_by_peer());
  }
  // Nothing of that harmed it.
  Client ok = Client::connect(dir.path, kGpu, Role::kPipeline, "after");
  EXPECT_EQ(clients_with_role(ok, "pipeline"), 1u);
}

TEST(GpudDaemon, AnObserverAsksForStatusWithoutBecomingAClient) {
  TempDir dir;
  DaemonThread d(test_options(dir.path));
  Client pipeline = Client::connect(dir.path, kGpu, Role::kPipeline, "gpipe_runner");
  Client be = Client::connect(dir.path, kGpu, Role::kBestEffort, "eval");
  {
    Client observer = Client::connect(dir.path, kGpu, Role::kObserver, "orion-gpud status");
    EXPECT_EQ(observer.id(), 0);
    EXPECT_THROW(observer.pipeline(), std::logic_error);
    EXPECT_THROW(observer.grant(), std::logic_error);
    const nlohmann::json s = observer.status();
    ASSERT_EQ(s.at("clients").size(), 2u) << s.dump();
    for (const auto& c : s["clients"]) EXPECT_NE(c["name"], "orion-gpud status");
    EXPECT_EQ(s.at("observers"), 1);
  }
  // Its leaving revokes nothing and it is gone from the count.
  ASSERT_TRUE(eventually([&] { return be.status().at("observers") == 0; }));
  const nlohmann::json after = be.status();
  EXPECT_EQ(after.at("grants_revoked"), 0);
  EXPECT_EQ(after.at("clients").size(), 2u);
  // An observer is handed no pages.
  Raw raw(dir.path);
  raw.send(hello("observer"));
  std::vector<int> fds;
  const std::string welcome = raw.reply(&fds);
  EXPECT_NE(welcome.find("\"welcome\""), std::string::npos) << welcome;
  EXPECT_TRUE(fds.empty()) << fds.size() << " descriptors handed to an observer";
  for (int fd : fds) close(fd);
}

TEST(GpudDaemon, ASilentConnectionIsClosedAtTheHelloDeadline) {
  TempDir dir;
  DaemonThread d(test_options(dir.path));
  Raw raw(dir.path);
  const std::string reply = raw.reply(nullptr, 2000);
  EXPECT_NE(reply.find("no hello within 200 ms"), std::string::npos) << reply;
}

TEST(GpudDaemon, OnePipelinePerGpuAndOneDaemonPerGpu) {
  TempDir dir;
  DaemonThread d(test_options(dir.path));
  Client first = Client::connect(dir.path, kGpu, Role::kPipeline, "first");
  try {
    Client::connect(dir.path, kGpu, Role::kPipeline, "second");
    ADD_FAILURE() << "a second pipeline was accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("a pipeline is already attached to this GPU"), std::string::npos) << e.what();
  }
  try {
    Daemon second(test_options(dir.path));
    ADD_FAILURE() << "a second daemon took the same GPU";
  } catch (const DaemonError& e) {
    EXPECT_NE(std::string(e.what()).find("another orion-gpud serves GPU GPU-test-0"), std::string::npos) << e.what();
  }
  // The first one still serves.
  EXPECT_EQ(clients_with_role(first, "pipeline"), 1u);
}

TEST(GpudDaemon, BadGpuNamesAndMissingDaemonsAreNamed) {
  TempDir dir;
  DaemonOptions o = test_options(dir.path);
  o.gpu = "../etc";
  try {
    Daemon bad(o);
    ADD_FAILURE() << "accepted a GPU name with a path in it";
  } catch (const DaemonError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a GPU UUID"), std::string::npos) << e.what();
  }
  try {
    Client::connect(dir.path, "GPU-nobody", Role::kBestEffort, "x");
    ADD_FAILURE() << "connected to no daemon";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("start one with `orion-gpud serve --gpu GPU-nobody`"), std::string::npos)
        << e.what();
  }
}

TEST(GpudDaemon, FuzzedMessagesNeverHarmTheDaemon) {
  TempDir dir;
  DaemonThread d(test_options(dir.path));
  std::mt19937 rng(25);
  const std::vector<std::string> seeds = {hello("pipeline"), hello("best_effort"), R"({"type":"status"})",
                                          R"({"type":"bye"})"};
  for (int i = 0; i < 200; ++i) {
    std::string m = seeds[rng() % seeds.size()];
    switch (rng() % 4) {
      case 0: m.resize(rng() % (m.size() + 1)); break;             // truncated
      case 1: m[rng() % m.size()] = static_cast<char>(rng()); break;  // a byte flipped
      case 2: m = std::string(1 + rng() % 6000, static_cast<char>(rng())); break;  // noise, maybe oversized
      default: m.insert(rng() % m.size(), std::string(rng() % 40, '{')); break;
    }
    Raw raw(dir.path);
    if (!m.empty()) raw.send_quietly(m);
    if (i % 3 == 0) raw.send_quietly(R"({"type":"status"})");  // out of order
  }
  Client ok = Client::connect(dir.path, kGpu, Role::kBestEffort, "after fuzz");
  EXPECT_TRUE(ok.status().contains("clients"));
}

TEST(GpudDaemon, StatusListsAsManyClientsAsTheDaemonServes) {
  TempDir dir;
  const DaemonOptions options = test_options(dir.path);
  DaemonThread d(options);
  std::vector<Client> clients;
  for (size_t i = 0; i < options.max_clients; ++i) {  // names of the longest kind allowed
    std::string name = "best effort job " + std::to_string(i);
    name.resize(64, '.');
    clients.push_back(Client::connect(dir.path, kGpu, Role::kBestEffort, name));
  }
  const nlohmann::json s = clients.front().status();
  ASSERT_EQ(s.at("clients").size(), options.max_clients);
  EXPECT_GT(s.dump().size(), 3 * kMaxMessageBytes);  // far longer than a client may send
  EXPECT_EQ(s["clients"].back()["name"].get<std::string>().rfind("best effort job 63.", 0), 0u);
  // Full: one more client is refused, naming the cap, while an observer still gets its status.
  try {
    Client::connect(dir.path, kGpu, Role::kBestEffort, "one too many");
    ADD_FAILURE() << "a client beyond max_clients was accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("serves at most 64 clients"), std::string::npos) << e.what();
  }
  Client observer = Client::connect(dir.path, kGpu, Role::kObserver, "monitor");
  EXPECT_EQ(observer.status().at("clients").size(), options.max_clients);
}

TEST(GpudDaemon, ObserversAreCappedApartFromClients) {
  TempDir dir;
  DaemonThread d(test_options(dir.path));
  std::vector<Client> observers;
  for (int i = 0; i < 8; ++i) observers.push_back(Client::connect(dir.path, kGpu, Role::kObserver, "monitor"));
  try {
    Client::connect(dir.path, kGpu, Role::kObserver, "ninth");
    ADD_FAILURE() << "a ninth observer was accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("at most 8 observers"), std::string::npos) << e.what();
  }
  // The GPU's clients are not crowded out by them.
  Client pipeline = Client::connect(dir.path, kGpu, Role::kPipeline, "gpipe_runner");
  EXPECT_EQ(pipeline.status().at("observers"), 8);
}

// ---- a client facing a daemon that is hung, gone or not ours ------------------------------------

// Binds the GPU's socket and answers nothing: a hung daemon. `accepting`: a thread accepts every
// connection (and keeps it); else none is accepted, and with a backlog of 0 the second connect
// finds the queue full.
struct FakeDaemon {
  int fd = -1;
  std::atomic<bool> stop{false};
  std::thread acceptor;
  std::vector<int> accepted;
  FakeDaemon(const fs::path& dir, bool accepting, int backlog = 16) {
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    const sockaddr_un addr = address_of(dir);
    if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, backlog) != 0) {
      ADD_FAILURE() << "fake daemon: " << std::strerror(errno);
    }
    if (!accepting) return;
    acceptor = std::thread([this] {
      while (!stop.load()) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 10) <= 0) continue;
        const int a = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (a >= 0) accepted.push_back(a);
      }
    });
  }
  // Closing the listener lets a connect that is stuck on it return.
  void close_listener() {
    stop = true;
    if (acceptor.joinable()) acceptor.join();
    if (fd >= 0) close(fd);
    fd = -1;
  }
  ~FakeDaemon() {
    close_listener();
    for (int a : accepted) close(a);
  }
};

// Client::connect with a 300 ms bound on another thread: what it threw ("connected" if nothing)
// and how long it took. If it has not returned after 5 s, `unblock` runs so the test can end.
std::pair<std::string, int64_t> connect_with_300ms_bound(const fs::path& dir, const std::function<void()>& unblock) {
  const int64_t start = monotonic_ns();
  auto attempt = std::async(std::launch::async, [&dir] {
    try {
      Client::connect(dir, kGpu, Role::kBestEffort, "waiting", 300 * kMs);
      return std::string("connected");
    } catch (const ProtocolError& e) {
      return std::string(e.what());
    }
  });
  if (attempt.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "Client::connect hung";
    unblock();
  }
  const std::string what = attempt.get();
  return {what, monotonic_ns() - start};
}

void expect_no_reply_within_300ms(const fs::path& dir, const std::pair<std::string, int64_t>& result) {
  const auto& [what, took_ns] = result;
  EXPECT_NE(what.find("no reply from orion-gpud within 300 ms at " + socket_path(dir, kGpu).string() +
                      ": is it running/hung?"),
            std::string::npos)
      << what;
  EXPECT_GE(took_ns, 250 * kMs);
  EXPECT_LT(took_ns, 1500 * kMs);
}

TEST(GpudClient, ADaemonThatAcceptsButNeverAnswersIsAnErrorWithinTheBound) {
  TempDir dir;
  FakeDaemon hung(dir.path, /*accepting=*/true);
  expect_no_reply_within_300ms(dir.path, connect_with_300ms_bound(dir.path, [&] { hung.close_listener(); }));
}

// A client whose thread is interrupted by a signal every 20 ms (a profiler's SIGPROF, SIGCHLD
// churn) still gives up on a hung daemon within its bound: each poll restarted after EINTR used
// to wait the whole bound again, so the wait never ended.
TEST(GpudClient, FrequentSignalsDoNotStretchTheBound) {
  TempDir dir;
  FakeDaemon hung(dir.path, /*accepting=*/true);
  struct sigaction action {};
  action.sa_handler = [](int) {};
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: poll returns EINTR
  struct sigaction previous {};
  ASSERT_EQ(sigaction(SIGALRM, &action, &previous), 0);
  const int64_t start = monotonic_ns();
  auto attempt = std::async(std::launch::async, [&dir] {
    // A timer that signals this thread only (SIGEV_THREAD_ID), every 20 ms.
    sigevent ev{};
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = SIGALRM;
    ev._sigev_un._tid = static_cast<pid_t>(syscall(SYS_gettid));
    timer_t timer{};
    if (timer_create(CLOCK_MONOTONIC, &ev, &timer) != 0) return std::string("timer_create failed");
    itimerspec every{{0, 20'000'000}, {0, 20'000'000}};
    timer_settime(timer, 0, &every, nullptr);
    std::string what = "connected";
    try {
      Client::connect(dir.path, kGpu, Role::kBestEffort, "signalled", 300 * kMs);
    } catch (const ProtocolError& e) {
      what = e.what();
    }
    timer_delete(timer);
    return what;
  });
  if (attempt.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "Client::connect under frequent signals hung";
    hung.close_listener();
  }
  const std::string what = attempt.get();
  sigaction(SIGALRM, &previous, nullptr);
  expect_no_reply_within_300ms(dir.path, {what, monotonic_ns() - start});
}

TEST(GpudClient, ADaemonThatAcceptsNothingIsAnErrorWithinTheBound) {
  TempDir dir;
  FakeDaemon hung(dir.path, /*accepting=*/false, /*backlog=*/0);
  Raw first(dir.path);  // the one connection its backlog holds: the next connect waits for room
  expect_no_reply_within_300ms(dir.path, connect_with_300ms_bound(dir.path, [&] { hung.close_listener(); }));
}

// A status ask that timed out leaves its reply to come later; the next ask must get its own
// reply, not that late one (a monitor polling a slow daemon showed old clients and windows).
TEST(GpudClient, ALateStatusReplyIsNotTakenForTheNextOne) {
  TempDir dir;
  const int listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  const sockaddr_un addr = address_of(dir.path);
  ASSERT_EQ(bind(listener, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  ASSERT_EQ(listen(listener, 1), 0);
  std::atomic<bool> first_ask_gave_up{false};
  std::string server_error;
  // A slow daemon: it answers the first status request only after its asker gave up.
  std::thread server([&] {
    pollfd waiting{listener, POLLIN, 0};
    if (poll(&waiting, 1, 5000) <= 0) {
      server_error = "no client connected";
      return;
    }
    const int c = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    auto next = [&]() -> nlohmann::json {
      pollfd p{c, POLLIN, 0};
      if (poll(&p, 1, 5000) <= 0) return {};
      char buf[kMaxMessageBytes];
      const ssize_t n = recv(c, buf, sizeof buf, 0);
      return n > 0 ? nlohmann::json::parse(std::string(buf, static_cast<size_t>(n)), nullptr, false) : nlohmann::json{};
    };
    auto reply = [&](const nlohmann::json& m) {
      const std::string text = m.dump();
      (void)send(c, text.data(), text.size(), MSG_NOSIGNAL);
    };
    if (next().value("type", "") != "hello") server_error = "no hello";
    reply({{"type", "welcome"}, {"client_id", 0}});
    const nlohmann::json first = next();
    while (!first_ask_gave_up) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    reply({{"type", "status"}, {"request", first.value("request", nlohmann::json())}, {"answer", "late"}});
    const nlohmann::json second = next();
    reply({{"type", "status"}, {"request", second.value("request", nlohmann::json())}, {"answer", "second"}});
    next();  // until the client closes
    close(c);
  });
  try {
    Client observer = Client::connect(dir.path, kGpu, Role::kObserver, "monitor");
    EXPECT_THROW(observer.status(100 * kMs), ProtocolError);
    first_ask_gave_up = true;
    EXPECT_EQ(observer.status(2000 * kMs).value("answer", ""), "second");
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  first_ask_gave_up = true;  // the server waits for it whatever happened
  server.join();
  close(listener);
  EXPECT_EQ(server_error, "");
}

TEST(GpudClient, ADaemonOfAnotherUidIsNotTrusted) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a listener of another uid";
  TempDir dir;
  // Bound here, listening in a child that became uid 65534 first: SO_PEERCRED names the listener's
  // credentials at listen().
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  const sockaddr_un addr = address_of(dir.path);
  ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  const pid_t child = fork();
  if (child == 0) {
    if (syscall(SYS_setresuid, 65534, 65534, 65534) != 0 || listen(fd, 4) != 0) _exit(1);
    for (;;) pause();
  }
  close(fd);
  std::string what;
  EXPECT_TRUE(eventually([&] {
    try {
      Client::connect(dir.path, kGpu, Role::kBestEffort, "trusting", 300 * kMs);
      what = "connected";
    } catch (const ProtocolError& e) {
      what = e.what();
    }
    return what.find("no orion-gpud for GPU") == std::string::npos;  // not listening yet
  }));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_NE(what.find("runs as uid 65534, neither this process's uid 0 nor root: not trusted"), std::string::npos)
      << what;
}

TEST(GpudClient, ItNoticesTheDaemonHungUpAndReachesARestartedOne) {
  TempDir dir;
  auto daemon = std::make_unique<DaemonThread>(test_options(dir.path));
  Client c = Client::connect(dir.path, kGpu, Role::kPipeline, "publisher");
  EXPECT_TRUE(c.daemon_alive());
  EXPECT_TRUE(c.status().contains("clients"));
  EXPECT_TRUE(c.daemon_alive());
  daemon.reset();
  EXPECT_TRUE(eventually([&] { return !c.daemon_alive(); }, 1000));
  daemon = std::make_unique<DaemonThread>(test_options(dir.path));
  Client again = Client::connect(dir.path, kGpu, Role::kPipeline, "publisher");
  EXPECT_TRUE(again.daemon_alive());
  EXPECT_FALSE(c.daemon_alive());
  EXPECT_EQ(clients_with_role(again, "pipeline"), 1u);
}

// ---- each party killed, as separate processes ----------------------------------------------------

struct Process {
  pid_t pid = -1;
  int out = -1;
  Process(const std::vector<std::string>& argv) {
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(pipe_fds[1]);
    out = pipe_fds[0];
  }
  ~Process() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    close(out);
  }
  std::string line(int timeout_ms = 5000) {
    std::string text;
    char c;
    while (true) {
      pollfd p{out, POLLIN, 0};
      if (poll(&p, 1, timeout_ms) <= 0 || read(out, &c, 1) != 1 || c == '\n') return text;
      text += c;
    }
  }
  void kill9() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

TEST(GpudDaemon, AnotherUidIsRefusedEvenWhenTheSocketIsOpen) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a process of another uid";
  TempDir dir;
  DaemonOptions o = test_options(dir.path);
  o.allowed_uids = {4242};  // opens the folder (0711) and socket (0666): SO_PEERCRED decides
  DaemonThread d(o);
  Process intruder({GPUD_TEST_CLIENT, "--dir", dir.path.string(), "--gpu", kGpu, "--as-uid", "65534"});
  const std::string said = intruder.line();
  EXPECT_NE(said.find("refused: orion-gpud refused: uid 65534 is not allowed"), std::string::npos) << said;
}

// Another user reconnecting in a loop (here: 16 silent connections of uid 65534, the waiting cap)
// used to fill the waiting slots, so that an allowed client was closed at accept; refused peers
// now have a small cap of their own.
TEST(GpudDaemon, RefusedPeersCannotCrowdOutAnAllowedClient) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a process of another uid";
  TempDir dir;
  DaemonOptions o = test_options(dir.path);
  o.allowed_uids = {4242};  // opens the socket (0666): SO_PEERCRED decides
  DaemonThread d(o);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const sockaddr_un addr = address_of(dir.path);  // before the fork: the child only makes syscalls
  const pid_t crowd = fork();
  ASSERT_GE(crowd, 0);
  if (crowd == 0) {
    // A child of a threaded process (and of a sanitizer's runtime): no allocation, syscalls only.
    if (syscall(SYS_setresgid, 65534, 65534, 65534) != 0 || syscall(SYS_setresuid, 65534, 65534, 65534) != 0) _exit(3);
    for (int i = 0; i < 16; ++i) {
      const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
      (void)connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);  // held open, silent
    }
    (void)!write(ready[1], "r", 1);
    pause();  // silent until killed
    _exit(0);
  }
  close(ready[1]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1) << "the other uid's process did not start";
  close(ready[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the daemon accepted them
  std::string error;
  try {
    Client c = Client::connect(dir.path, kGpu, Role::kBestEffort, "allowed", 500 * kMs);
  } catch (const std::exception& e) {
    error = e.what();
  }
  kill(crowd, SIGKILL);
  waitpid(crowd, nullptr, 0);
  EXPECT_EQ(error, "") << "an allowed client was crowded out by refused peers";
}

// `orion-gpud status` (the binary) asks as an observer: the clients it prints are the GPU's only.
TEST(GpudDaemon, TheStatusCommandIsNotOneOfTheClients) {
  TempDir dir;
  DaemonThread d(test_options(dir.path));
  Client be = Client::connect(dir.path, kGpu, Role::kBestEffort, "eval");
  const std::string command = std::string(GPUD_BINARY) + " status --gpu " + kGpu + " --dir '" + dir.path.string() + "'";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << out;
  const nlohmann::json s = nlohmann::json::parse(out);
  ASSERT_EQ(s.at("clients").size(), 1u) << out;
  EXPECT_EQ(s["clients"][0]["name"], "eval");
  EXPECT_EQ(s.at("observers"), 1);
  EXPECT_EQ(be.status().at("grants_revoked"), 0);
}

std::vector<std::string> client_argv(const fs::path& dir, const char* role) {
  return {GPUD_TEST_CLIENT, "--dir", dir.string(), "--gpu", kGpu, "--role", role};
}

// A daemon in this process and client processes that can be killed.
struct GpudKill : ::testing::Test {
  TempDir dir;
  // A heartbeat goes stale only after 10 s here: a pipeline's death must be noticed through its
  // pidfd or socket.
  static DaemonOptions options(const fs::path& dir) {
    DaemonOptions o = test_options(dir);
    o.grants.stale_after_ns = 10'000 * kMs;
    return o;
  }
  DaemonThread daemon{options(dir.path)};
  // A gpud_test_client in `role`, once it said it attached.
  std::unique_ptr<Process> attached(const char* role) {
    auto p = std::make_unique<Process>(client_argv(dir.path, role));
    const std::string said = p->line();
    EXPECT_EQ(said.rfind("attached", 0), 0u) << said;
    return p;
  }
};

TEST_F(GpudKill, AKilledBestEffortClientLosesItsGrantAndTheDaemonCarriesOn) {
  Client watcher = Client::connect(dir.path, kGpu, Role::kPipeline, "watcher");
  auto be = attached("best_effort");
  ASSERT_EQ(clients_with_role(watcher, "best_effort"), 1u);
  be->kill9();
  ASSERT_TRUE(eventually([&] { return clients_with_role(watcher, "best_effort") == 0; }, 1000))
      << "the daemon did not notice within 1 s";
  EXPECT_EQ(watcher.status()["grants_revoked"], 1);
}

TEST_F(GpudKill, AKilledPipelineFreesBestEffortWork) {
  Client be = Client::connect(dir.path, kGpu, Role::kBestEffort, "eval");
  auto pipeline = attached("pipeline");
  ASSERT_TRUE(eventually([&] { return read_grant(be.grant()).mode == GrantMode::kGated; }));
  const int64_t killed_at = monotonic_ns();
  pipeline->kill9();
  ASSERT_TRUE(eventually([&] { return read_grant(be.grant()).mode == GrantMode::kFree; }, 1000));
  // Noticed through its pidfd / socket: the heartbeat would go stale only after 10 s.
  EXPECT_LT(monotonic_ns() - killed_at, 2'000 * kMs);
  EXPECT_EQ(clients_with_role(be, "pipeline"), 0u);
  attached("pipeline");  // a new pipeline may attach
}

TEST_F(GpudKill, APipelineThatLeftButLivesOnCannotWriteTheNextPipelinesWindows) {
  Client be = Client::connect(dir.path, kGpu, Role::kBestEffort, "eval");
  // It closes its connection and goes on heartbeating and publishing [now, now + 1 s) every 5 ms
  // through the mapping it kept.
  std::vector<std::string> argv = client_argv(dir.path, "pipeline");
  argv.push_back("--leave");
  Process stale(argv);
  EXPECT_EQ(stale.line().rfind("attached", 0), 0u);
  EXPECT_EQ(stale.line(), "left");
  ASSERT_TRUE(eventually([&] { return clients_with_role(be, "pipeline") == 0; }));
  // What best-effort clients read once a pipeline attached must be that pipeline's alone.
  auto publishes_alone = [&](Client& next) {
    const int64_t now = monotonic_ns();
    const int64_t open = now + 7 * kMs, close = now + 8 * kMs;
    const bool clean = read_window(be.pipeline()).windows_published == 0;
    heartbeat(next.pipeline_writable(), now);
    publish_window(next.pipeline_writable(), open, close);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // six of the stale writer's rounds
    const WindowView w = read_window(be.pipeline());
    return clean && w.open_ns == open && w.close_ns == close && w.windows_published == 1 && w.heartbeat_ns == now;
  };
  std::string refusal;
  try {
    Client early = Client::connect(dir.path, kGpu, Role::kPipeline, "next");
    EXPECT_TRUE(publishes_alone(early)) << "the stale writer overwrote the next pipeline's window";
  } catch (const ProtocolError& e) {
    refusal = e.what();
  }
  EXPECT_NE(refusal.find("the previous pipeline (pid " + std::to_string(stale.pid) +
                         ") left but its process still runs"),
            std::string::npos)
      << refusal;
  EXPECT_EQ(be.status()["pipeline_refused_until_pid_exits"], stale.pid);
  stale.kill9();
  Client next = Client::connect(dir.path, kGpu, Role::kPipeline, "next");
  EXPECT_TRUE(publishes_alone(next));
  EXPECT_FALSE(be.status().contains("pipeline_refused_until_pid_exits"));
}

TEST(GpudDaemonKilled, ItsClientsKeepTheirLeaseThenFallBack) {
  TempDir dir;
  Process daemon({GPUD_BINARY, "serve", "--gpu", kGpu, "--dir", dir.path.string(), "--lease-ms", "1000",
                  "--stale-ms", "60"});
  ASSERT_TRUE(eventually([&] { return fs::exists(socket_path(dir.path, kGpu)); }));
  Client pipeline = Client::connect(dir.path, kGpu, Role::kPipeline, "gpipe_runner");
  Client be = Client::connect(dir.path, kGpu, Role::kBestEffort, "eval");
  auto beat = [&] {
    const int64_t now = monotonic_ns();
    heartbeat(pipeline.pipeline_writable(), now);
    publish_window(pipeline.pipeline_writable(), now - kMs, now + 100 * kMs);
  };
  ASSERT_TRUE(eventually([&] { beat(); return read_grant(be.grant()).mode == GrantMode::kGated; }));
  AdmissionConfig hold, pass;
  pass.fallback = Fallback::kPassThrough;
  daemon.kill9();
  EXPECT_TRUE(eventually([&] { return !pipeline.daemon_alive() && !be.daemon_alive(); }, 1000));
  // The pipeline never needed the daemon: it still publishes (its page is its own memory).
  beat();
  // Until the lease runs out the grant stands; then each client falls back as it chose.
  const GrantView g = read_grant(be.grant());
  EXPECT_EQ(admit(read_window(be.pipeline()), g, monotonic_ns(), 1 * kMs, 0, hold).verdict, Verdict::kRun);
  const int64_t after_lease = g.lease_expiry_ns + 1;
  EXPECT_STREQ(admit(read_window(be.pipeline()), g, after_lease, 1 * kMs, 0, hold).reason, "lease expired: holding");
  EXPECT_EQ(admit(read_window(be.pipeline()), g, after_lease, 1 * kMs, 0, pass).verdict, Verdict::kRun);
  // The lease really is not renewed any more, and a restarted daemon takes the GPU over.
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(read_grant(be.grant()).lease_expiry_ns, g.lease_expiry_ns);
  Process again({GPUD_BINARY, "serve", "--gpu", kGpu, "--dir", dir.path.string()});
  ASSERT_TRUE(eventually([&] {
    try {
      Client c = Client::connect(dir.path, kGpu, Role::kBestEffort, "after restart");
      return true;
    } catch (const ProtocolError&) {
      return false;
    }
  }));
}

}  // namespace
}  // namespace gpud
