// orion-gpud as a server, in process: the hello and the pages it hands over, every refusal
// (version, malformed, oversized, silent, second pipeline, second daemon) and a fuzzed protocol.
// The client's side is client_test.cpp; killing each party for real, daemon_process_test.cpp.
#include <sys/resource.h>

#include "daemon_test_support.h"

namespace gpud {
namespace {

using namespace daemon_test;

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
  ASSERT_TRUE(eventually([&] { return read_grant(be.grant()).mode == GrantMode::kFree; }));
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

// A best-effort client of the daemon's uid owns the pages' inodes and can fchmod them (even
// through a read-only descriptor). The daemon opened each page's read-only descriptor when it made
// the page, so the next client still gets its pages; reopening through /proc per hello failed
// with EACCES for every later client. Root reopens any mode, so the daemon and its clients run in
// a child process as an ordinary user (nobody, when the test runs as root).
TEST(GpudDaemon, AClientThatChmodsItsPagesCannotLockTheNextOneOut) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(3);
    int rc = 0;
    try {
      TempDir dir;
      DaemonThread d(test_options(dir.path));
      Client pipeline = Client::connect(dir.path, kGpu, Role::kPipeline, "gpipe_runner");
      Raw raw(dir.path);
      raw.send_quietly(hello("best_effort"));
      std::vector<int> fds;
      if (raw.reply(&fds).find("\"welcome\"") == std::string::npos || fds.empty()) _exit(2);
      for (int f : fds) {
        if (fchmod(f, 0) != 0) _exit(4);
        close(f);
      }
      try {
        Client next = Client::connect(dir.path, kGpu, Role::kBestEffort, "next");
      } catch (const std::exception&) {
        rc = 1;
      }
    } catch (const std::exception&) {
      rc = 2;
    }
    _exit(rc);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the next client was locked out; 2: the set-up failed; 3: could not "
                                       "become an ordinary user; 4: fchmod refused";
}

// The daemon trusts and watches the process that connected (SO_PEERCRED). A connection handed on
// by a process that then exited belongs to no process it can watch: its hello is refused, naming
// why. Before, the pidfd was opened from the pid at the hello: for a gone process none was, and the
// client was welcomed unwatched (or, with the pid reused, watched as some other process).
TEST(GpudDaemon, AConnectionWhoseConnectorExitedIsRefusedAtItsHello) {
  TempDir dir;
  DaemonOptions o = test_options(dir.path);
  o.hello_timeout_ns = 10'000 * kMs;  // the holder stays silent a while first
  DaemonThread d(o);
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
  const sockaddr_un addr = address_of(dir.path);  // before the fork: the child only makes syscalls
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // connects, hands the connection to the test, exits
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) _exit(2);
    const char byte = 0;
    _exit(send_with_fd(pair[1], &byte, 1, fd, 0) == 1 ? 0 : 3);
  }
  close(pair[1]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child could not connect or hand on";
  const int handed_fd = receive_fd(pair[0]);
  close(pair[0]);
  ASSERT_GE(handed_fd, 0) << "no connection was handed on";
  Raw handed(handed_fd);
  // Silent for 500 ms: the daemon waits for the hello without spinning on the exited process's
  // pidfd (a reaped process's pidfd reports POLLHUP whatever poll asks; it used to stay in the
  // poll set and keep the daemon on a whole core until the hello or its deadline).
  auto cpu_ms = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1000.0 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1000.0;
  };
  const double cpu_before = cpu_ms();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // Idle, the daemon's ticks cost ~3 ms of CPU here; spinning, up to the whole 500 ms (190 ms
  // measured on a loaded 2-core machine).
  EXPECT_LT(cpu_ms() - cpu_before, 100.0) << "the daemon spun while the connection stayed silent";
  handed.send(hello("best_effort"));
  std::vector<int> fds;
  const std::string reply = handed.reply(&fds);
  for (int fd : fds) close(fd);
  EXPECT_NE(reply.find("the process that opened this connection (pid " + std::to_string(child) + ") has exited"),
            std::string::npos)
      << reply;
  EXPECT_TRUE(fds.empty()) << "a page went to a connection no process the daemon watches holds";
  // The daemon carries on: the next client of a live process is welcomed.
  Raw next(dir.path);
  next.send(hello("best_effort"));
  std::vector<int> next_fds;
  EXPECT_NE(next.reply(&next_fds).find("\"welcome\""), std::string::npos);
  for (int fd : next_fds) close(fd);
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
      {nlohmann::json{{"type", "hello"}, {"version", kProtocolVersion}, {"role", "best_effort"}, {"pid", getpid()},
                      {"name", "job\n[info] orion-gpud: forged"}}.dump(),
       "'name' must hold no control characters"},
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

// Clients send no descriptors. The daemon reads with no room for any, so a descriptor a peer
// attaches is dropped by the kernel and never becomes the daemon's: closing it on the daemon's
// one thread would run the file's flush, which a FUSE server can hold forever (no ticks, every
// lease lapsing). The message is refused.
TEST(GpudDaemon, AMessageWithDescriptorsIsRefusedWithoutTheDaemonTakingThem) {
  TempDir dir;
  DaemonThread d(test_options(dir.path));
  Raw raw(dir.path);
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  const std::string text = hello("pipeline");
  ASSERT_EQ(send_with_fd(raw.fd, text.data(), text.size(), pipe_fds[0]), static_cast<ssize_t>(text.size()));
  close(pipe_fds[0]);
  const std::string reply = raw.reply();
  EXPECT_NE(reply.find("a message with descriptors attached (clients send none)"), std::string::npos) << reply;
  EXPECT_TRUE(raw.closed_by_peer());
  // No read end is left anywhere: the kernel dropped the one in flight.
  pollfd writer{pipe_fds[1], POLLOUT, 0};
  ASSERT_EQ(poll(&writer, 1, 0), 1);
  EXPECT_NE(writer.revents & POLLERR, 0) << "a read end of the pipe is still open";
  close(pipe_fds[1]);
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
    EXPECT_NE(std::string(e.what()).find("serves at most 64 best-effort clients"), std::string::npos) << e.what();
  }
  Client observer = Client::connect(dir.path, kGpu, Role::kObserver, "monitor");
  EXPECT_EQ(observer.status().at("clients").size(), options.max_clients);
  // The pipeline still gets in: crowded out, it could not publish its windows and the
  // best-effort clients would run free beside it.
  Client pipeline = Client::connect(dir.path, kGpu, Role::kPipeline, "gpipe_runner");
  EXPECT_EQ(observer.status().at("clients").size(), options.max_clients + 1);
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


}  // namespace
}  // namespace gpud
