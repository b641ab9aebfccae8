// A gpud client facing a daemon that is hung, gone or not ours: every wait bounded (signals
// included), a late reply never taken for the next one, a restarted daemon reached again.
#include "daemon_test_support.h"
#include "peer.h"
#include "socket_io.h"

namespace gpud {
namespace {

using namespace daemon_test;

// Signals every 20 ms to one thread (SIGALRM without SA_RESTART: blocking calls return EINTR),
// what a profiler's SIGPROF or SIGCHLD churn does: run(body) runs body in a thread of its own so
// interrupted. The handler is installed while this lives.
struct Signalled {
  struct sigaction previous {};
  Signalled() {
    struct sigaction action {};
    action.sa_handler = [](int) {};
    sigemptyset(&action.sa_mask);
    action.sa_flags = 0;
    EXPECT_EQ(sigaction(SIGALRM, &action, &previous), 0);
  }
  ~Signalled() { sigaction(SIGALRM, &previous, nullptr); }
  static std::future<std::string> run(std::function<std::string()> body) {
    return std::async(std::launch::async, [body = std::move(body)] {
      sigevent ev{};
      ev.sigev_notify = SIGEV_THREAD_ID;  // this thread only
      ev.sigev_signo = SIGALRM;
      ev._sigev_un._tid = static_cast<pid_t>(syscall(SYS_gettid));
      timer_t timer{};
      if (timer_create(CLOCK_MONOTONIC, &ev, &timer) != 0) return std::string("timer_create failed");
      itimerspec every{{0, 20'000'000}, {0, 20'000'000}};
      timer_settime(timer, 0, &every, nullptr);
      std::string what = body();
      timer_delete(timer);
      return what;
    });
  }
};

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
  EXPECT_LT(took_ns, 3000 * kMs);  // a missing bound hangs until the 5 s watchdog
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
  Signalled signals;
  const int64_t start = monotonic_ns();
  auto attempt = Signalled::run([&dir] {
    try {
      Client::connect(dir.path, kGpu, Role::kBestEffort, "signalled", 300 * kMs);
    } catch (const ProtocolError& e) {
      return std::string(e.what());
    }
    return std::string("connected");
  });
  if (attempt.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "Client::connect under frequent signals hung";
    hung.close_listener();
  }
  const std::string what = attempt.get();
  expect_no_reply_within_300ms(dir.path, {what, monotonic_ns() - start});
}

// The send side of the same rule: a send waiting for room in a daemon's full queue (it stopped
// reading) gives up within its bound under frequent signals; each sendmsg restarted after EINTR
// used to wait the whole SO_SNDTIMEO again.
TEST(GpudClient, FrequentSignalsDoNotStretchASendsBound) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  const std::string filler(1000, 'x');
  while (send(sv[0], filler.data(), filler.size(), MSG_NOSIGNAL | MSG_DONTWAIT) > 0) {
  }
  ASSERT_TRUE(errno == EAGAIN || errno == EWOULDBLOCK) << std::strerror(errno);
  const timeval bound{0, 300'000};
  ASSERT_EQ(setsockopt(sv[0], SOL_SOCKET, SO_SNDTIMEO, &bound, sizeof bound), 0);
  Signalled signals;
  const int64_t start = monotonic_ns();
  auto attempt = Signalled::run([fd = sv[0]] {
    try {
      io::send_message(fd, {{"type", "status"}});
    } catch (const io::SendTimeout&) {
      return std::string("timed out");
    } catch (const ProtocolError& e) {
      return std::string(e.what());
    }
    return std::string("sent");
  });
  if (attempt.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "a send under frequent signals never gave up";
    close(sv[1]);  // the peer goes: the send fails, the thread ends
    sv[1] = -1;
  }
  const std::string what = attempt.get();
  EXPECT_EQ(what, "timed out");
  EXPECT_LT(monotonic_ns() - start, 4'000 * kMs) << "the 300 ms bound stretched";  // unbounded: the 5 s watchdog
  close(sv[0]);
  if (sv[1] >= 0) close(sv[1]);
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
  FakeDaemon daemon(dir.path, /*accepting=*/false, /*backlog=*/1);  // the test accepts and answers
  const int listener = daemon.fd;
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
    EXPECT_EQ(observer.status(10'000 * kMs).value("answer", ""), "second");
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  first_ask_gave_up = true;  // the server waits for it whatever happened
  server.join();
  EXPECT_EQ(server_error, "");
}

// A daemon that welcomed us and then stopped reading: status requests fill the socket's queue.
// Each status() still ends within its own bound; its send waited up to connect's 2 s once the
// queue was full.
TEST(GpudClient, StatusKeepsItsBoundWhenTheDaemonStopsReading) {
  TempDir dir;
  FakeDaemon daemon(dir.path, /*accepting=*/false, /*backlog=*/1);  // the test accepts and answers
  const int listener = daemon.fd;
  std::atomic<bool> done{false};
  std::thread server([&] {
    pollfd waiting{listener, POLLIN, 0};
    if (poll(&waiting, 1, 5000) <= 0) return;
    const int c = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    char buf[kMaxMessageBytes];
    pollfd p{c, POLLIN, 0};
    if (poll(&p, 1, 5000) > 0) (void)recv(c, buf, sizeof buf, 0);  // the hello
    const std::string welcome = nlohmann::json{{"type", "welcome"}, {"client_id", 0}}.dump();
    (void)send(c, welcome.data(), welcome.size(), MSG_NOSIGNAL);
    while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // reads nothing more
    close(c);
  });
  int64_t slowest = 0;
  try {
    Client observer = Client::connect(dir.path, kGpu, Role::kObserver, "monitor");
    const int64_t until = monotonic_ns() + 4'000 * kMs;  // the queue is full after about 3 s
    for (int i = 0; i < 3000 && monotonic_ns() < until; ++i) {
      const int64_t start = monotonic_ns();
      EXPECT_THROW(observer.status(10 * kMs), ProtocolError);
      slowest = std::max(slowest, monotonic_ns() - start);
      if (slowest > 1500 * kMs) break;
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  done = true;
  server.join();
  // A send stuck on the full queue took the 2 s default bound; a preempted call takes far less.
  EXPECT_LT(slowest, 1500 * kMs) << "a status(10 ms) took " << slowest / kMs << " ms";
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

// Only a peer the socket says was reaped is refused as exited; a failure that says nothing of it
// (the daemon out of descriptors: EMFILE) refused a live client with a false reason. Here a
// descriptor that is no socket (ENOTSOCK) stands for such a failure.
TEST(GpudPeer, APidfdThatCannotBeHadDoesNotMakeAPeerGone) {
  int pipe_fds[2] = {-1, -1};
  ASSERT_EQ(pipe(pipe_fds), 0);
  bool gone = true;
  EXPECT_EQ(peer_pidfd(pipe_fds[0], getpid(), &gone), -1);
  EXPECT_FALSE(gone) << "a failure that says nothing of the peer took it for exited";
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

}  // namespace
}  // namespace gpud
