// orion-gpud and its clients as separate processes (the daemon binary and gpud_test_client): a
// peer of another uid refused, refused peers never crowding out an allowed one, and each party
// killed for real.
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include "daemon_test_support.h"

extern char** environ;

namespace gpud {
namespace {

using namespace daemon_test;

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
    // The crowding showed as a refusal at accept, not as slowness: a generous bound.
    Client c = Client::connect(dir.path, kGpu, Role::kBestEffort, "allowed", 5'000 * kMs);
  } catch (const std::exception& e) {
    error = e.what();
  }
  kill(crowd, SIGKILL);
  waitpid(crowd, nullptr, 0);
  EXPECT_EQ(error, "") << "an allowed client was crowded out by refused peers";
}

// A refused uid connecting in a loop must not stall the daemon's tick on its log: at most 5
// refusal lines a second, and the next second's first line counts the ones left out.
TEST(GpudDaemon, RefusalsAreLoggedAtMostFiveASecondAndTheRestCounted) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a process of another uid";
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
  spdlog::default_logger()->sinks().push_back(sink);
  struct Unhook {  // the sink goes whatever the test's outcome
    ~Unhook() { spdlog::default_logger()->sinks().pop_back(); }
  } unhook;
  auto count = [&sink](const std::string& text) {
    size_t n = 0;
    for (const auto& line : sink->last_formatted()) n += line.find(text) != std::string::npos;
    return n;
  };
  TempDir dir;
  DaemonOptions o = test_options(dir.path);
  o.allowed_uids = {4242};  // opens the socket (0666): SO_PEERCRED decides
  DaemonThread d(o);
  const sockaddr_un addr = address_of(dir.path);  // before the fork: the child only makes syscalls
  // `n` connections of uid 65534, each closed at once (so none waits long enough to meet a cap).
  auto intrude = [&addr](int n) {
    const pid_t child = fork();
    if (child == 0) {
      if (syscall(SYS_setresgid, 65534, 65534, 65534) != 0 || syscall(SYS_setresuid, 65534, 65534, 65534) != 0) _exit(3);
      for (int i = 0; i < n; ++i) {
        const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) _exit(4);
        close(fd);
      }
      _exit(0);
    }
    int status = -1;
    if (child > 0) waitpid(child, &status, 0);
    return child > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  };
  const std::string refused = "refused pid";
  ASSERT_TRUE(intrude(12)) << "the other uid's process could not connect";
  ASSERT_TRUE(eventually([&] { return count(refused) >= 5; })) << "the first refusals were not logged";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the other 7 were accepted meanwhile
  EXPECT_EQ(count(refused), 5u) << "more than 5 refusal lines in a second";
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // the next second
  ASSERT_TRUE(intrude(1));
  EXPECT_TRUE(eventually([&] { return count("7 more refusals not logged") == 1; }))
      << "the refusals left out were not counted";
  EXPECT_TRUE(eventually([&] { return count(refused) == 6; })) << "the next second's refusal was not logged";
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

// Times that cannot work are refused before the daemon starts, naming the option: a lease shorter
// than a few ticks lapses between renewals, a staleness under the pipeline's 5 ms heartbeat flaps.
TEST(GpudDaemon, ServeRefusesTimesThatCannotWork) {
  TempDir dir;
  for (const char* bad : {"--lease-ms 5", "--stale-ms 2", "--lease-ms 1e13"}) {
    const std::string command = std::string(GPUD_BINARY) + " serve --gpu " + kGpu + " --dir '" + dir.path.string() +
                                "' " + bad + " 2>&1";
    FILE* pipe = popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
    EXPECT_NE(pclose(pipe), 0) << bad << ": " << out;
    EXPECT_NE(out.find(std::string(bad).substr(0, std::string(bad).find(' '))), std::string::npos) << bad << ": " << out;
    EXPECT_FALSE(fs::exists(socket_path(dir.path, kGpu))) << bad;
  }
}

// SIGHUP (a closed terminal) stops the daemon in order, as SIGTERM does: its clients' grants read
// revoked at once, not left free until their leases run out.
TEST(GpudDaemon, SighupStopsTheDaemonInOrder) {
  TempDir dir;
  Process daemon({GPUD_BINARY, "serve", "--gpu", kGpu, "--dir", dir.path.string(), "--lease-ms", "60000"});
  ASSERT_TRUE(eventually([&] { return fs::exists(socket_path(dir.path, kGpu)); }));
  Client be = Client::connect(dir.path, kGpu, Role::kBestEffort, "eval");
  ASSERT_EQ(read_grant(be.grant()).mode, GrantMode::kFree);
  ASSERT_EQ(kill(daemon.pid, SIGHUP), 0);
  EXPECT_TRUE(eventually([&] { return read_grant(be.grant()).mode == GrantMode::kRevoked; }));
  // ... with its lease over: the daemon is gone, so the client's fallback applies at once.
  EXPECT_LE(read_grant(be.grant()).lease_expiry_ns, monotonic_ns());
  int status = 0;
  ASSERT_EQ(waitpid(daemon.pid, &status, 0), daemon.pid);
  daemon.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
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
  // Within 5 s: the heartbeat goes stale only after 10 s, so the pidfd or socket told.
  ASSERT_TRUE(eventually([&] { return clients_with_role(watcher, "best_effort") == 0; }, 5000))
      << "the daemon did not notice within 5 s";
  EXPECT_EQ(watcher.status()["grants_revoked"], 1);
}

TEST_F(GpudKill, AKilledPipelineFreesBestEffortWork) {
  Client be = Client::connect(dir.path, kGpu, Role::kBestEffort, "eval");
  auto pipeline = attached("pipeline");
  ASSERT_TRUE(eventually([&] { return read_grant(be.grant()).mode == GrantMode::kGated; }));
  const int64_t killed_at = monotonic_ns();
  pipeline->kill9();
  ASSERT_TRUE(eventually([&] { return read_grant(be.grant()).mode == GrantMode::kFree; }, 5000));
  // Noticed through its pidfd / socket: the heartbeat would go stale only after 10 s.
  EXPECT_LT(monotonic_ns() - killed_at, 6'000 * kMs);
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
  EXPECT_TRUE(eventually([&] { return !pipeline.daemon_alive() && !be.daemon_alive(); }, 5000));
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
