// launch_workers(): posix_spawn one worker per local rank, forward signals to them, and tear the
// group down when one fails (torchrun's local elastic agent, minus restarts).
#include "trainer/launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "trainer/launch/world.h"

extern char** environ;

namespace gpipe {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::array kForwardedSignals{SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
constexpr std::chrono::milliseconds kKillAfterTerm{5000};
// Upper bound on one wait, so a SIGCHLD that lands on a thread blocking it cannot stall the loop.
constexpr std::chrono::milliseconds kMaxPoll{200};

// The variables the launcher owns; inherited copies are dropped so the children see ours only. The
// torchelastic ones would make the workers look for a torchrun agent store that does not exist.
constexpr std::array<std::string_view, 9> kOwnedVariables{
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT"};

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGXCPU:
      return "SIGXCPU";
    default:
      return "signal " + std::to_string(sig);
  }
}

// --- signal plumbing: handlers write the signal number into a self-pipe ---------------------------
// Handlers rather than sigwait: the runner has other threads (spdlog, LibTorch) that do not block
// these signals, so a process-directed SIGTERM may run on any of them; a handler works wherever it runs.
std::atomic<int> g_signal_pipe_write{-1};
std::atomic<bool> g_launch_active{false};

extern "C" void on_launcher_signal(int sig) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  const int fd = g_signal_pipe_write.load();
  // A failed write means a full pipe, which wakes the loop anyway.
  if (fd >= 0 && ::write(fd, &byte, 1) < 0) errno = saved_errno;
  errno = saved_errno;
}

// Installs the handlers for the forwarded signals and SIGCHLD for its lifetime. A signal the
// launcher was started with ignored (nohup's SIGHUP) stays ignored and is not forwarded; the
// children inherit that across exec.
class SignalRelay {
 public:
  SignalRelay() {
    if (g_launch_active.exchange(true)) throw WorldError("launch_workers is already running in this process");
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      g_launch_active = false;
      throw WorldError(std::string("cannot create the launcher's signal pipe: ") + std::strerror(errno));
    }
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    g_signal_pipe_write = write_fd_;
    install(SIGCHLD, SA_RESTART | SA_NOCLDSTOP);
    for (int sig : kForwardedSignals) install(sig, SA_RESTART);
  }
  ~SignalRelay() {
    for (auto& [sig, old] : saved_) ::sigaction(sig, &old, nullptr);
    g_signal_pipe_write = -1;
    ::close(read_fd_);
    ::close(write_fd_);
    g_launch_active = false;
  }
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  // Waits up to `timeout` for a signal; returns the signals received since the last call.
  std::vector<int> wait(std::chrono::milliseconds timeout) {
    pollfd pfd{read_fd_, POLLIN, 0};
    const int ms = static_cast<int>(std::clamp<int64_t>(timeout.count(), 0, kMaxPoll.count()));
    ::poll(&pfd, 1, ms);  // EINTR just means "look again"
    std::vector<int> got;
    unsigned char buffer[64];
    ssize_t n;
    while ((n = ::read(read_fd_, buffer, sizeof buffer)) > 0)
      for (ssize_t i = 0; i < n; ++i) got.push_back(buffer[i]);
    return got;
  }

 private:
  void install(int sig, int flags) {
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    if (sig != SIGCHLD && old.sa_handler == SIG_IGN) return;
    struct sigaction action {};
    action.sa_handler = on_launcher_signal;
    action.sa_flags = flags;
    sigemptyset(&action.sa_mask);
    ::sigaction(sig, &action, nullptr);
    saved_.emplace_back(sig, old);
  }

  int read_fd_ = -1, write_fd_ = -1;
  std::vector<std::pair<int, struct sigaction>> saved_;
};

// --- children -------------------------------------------------------------------------------------
struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool alive = false;
};

std::vector<std::string> child_environment(const LaunchOptions& o, int local_rank) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    if (std::find(kOwnedVariables.begin(), kOwnedVariables.end(), name) == kOwnedVariables.end())
      env.emplace_back(entry);
  }
  const int world = o.nnodes * o.nproc_per_node;
  env.push_back("RANK=" + std::to_string(o.node_rank * o.nproc_per_node + local_rank));
  env.push_back("WORLD_SIZE=" + std::to_string(world));
  env.push_back("LOCAL_RANK=" + std::to_string(local_rank));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(o.nproc_per_node));
  env.push_back("GROUP_RANK=" + std::to_string(o.node_rank));
  env.push_back("MASTER_ADDR=" + o.master_addr);
  env.push_back("MASTER_PORT=" + std::to_string(o.master_port));
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

pid_t spawn_child(const LaunchOptions& o, const std::vector<std::string>& argv, int local_rank) {
  std::vector<std::string> args = argv, env = child_environment(o, local_rank);
  std::vector<char*> c_args = c_strings(args), c_env = c_strings(env);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The worker starts with nothing blocked, whatever mask the launching thread has.
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int err = ::posix_spawn(&pid, argv[0].c_str(), nullptr, &attr, c_args.data(), c_env.data());
  posix_spawnattr_destroy(&attr);
  if (err != 0)
    throw WorldError("cannot start worker " + std::to_string(local_rank) + " (" + argv[0] + "): " + std::strerror(err));
  return pid;
}

// 0 for a clean exit, the exit code, or 128+signal when killed by a signal (the shell's convention).
int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

std::string outcome_of(int status) {
  return WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                           : "killed by signal " + signal_name(WTERMSIG(status));
}

void signal_all(const std::vector<Child>& children, int sig) {
  for (const Child& c : children)
    if (c.alive) ::kill(c.pid, sig);
}

// Supervises the started children until every one is reaped. `stop_now` (spawn failed part-way)
// starts the teardown at once, as if a worker had failed with that exit code.
int supervise(std::vector<Child>& children, SignalRelay& relay, std::chrono::milliseconds grace,
              std::optional<int> stop_now = std::nullopt) {
  std::optional<int> first_failure = stop_now;
  std::optional<Clock::time_point> term_at = stop_now ? std::optional(Clock::now()) : std::nullopt;
  std::optional<Clock::time_point> kill_at;
  bool term_sent = false, kill_sent = false;
  for (;;) {
    for (Child& c : children) {
      if (!c.alive) continue;
      int status = 0;
      const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r == 0 || (r < 0 && errno == EINTR)) continue;
      c.alive = false;
      if (r < 0) {  // someone else reaped it (SIGCHLD set to SIG_IGN elsewhere): nothing left to wait for
        spdlog::warn("launcher: rank {} (pid {}) vanished: {}", c.rank, c.pid, std::strerror(errno));
        continue;
      }
      const int code = exit_code_of(status);
      if (code == 0) {
        spdlog::debug("launcher: rank {} (pid {}) exited cleanly", c.rank, c.pid);
      } else if (!first_failure) {
        first_failure = code;
        term_at = Clock::now() + grace;
        spdlog::error("launcher: rank {} (pid {}) failed: {}; giving the other workers {} ms to exit", c.rank, c.pid,
                      outcome_of(status), grace.count());
      } else {
        spdlog::warn("launcher: rank {} (pid {}) failed: {}", c.rank, c.pid, outcome_of(status));
      }
    }
    if (std::none_of(children.begin(), children.end(), [](const Child& c) { return c.alive; })) break;

    const auto now = Clock::now();
    if (term_at && !term_sent && now >= *term_at) {
      spdlog::warn("launcher: sending SIGTERM to the remaining workers");
      signal_all(children, SIGTERM);
      term_sent = true;
      kill_at = now + kKillAfterTerm;
    }
    if (kill_at && !kill_sent && now >= *kill_at) {
      spdlog::error("launcher: workers still running {} ms after SIGTERM; sending SIGKILL", kKillAfterTerm.count());
      signal_all(children, SIGKILL);
      kill_sent = true;
    }
    auto timeout = kMaxPoll;
    for (const auto& deadline : {term_sent ? std::nullopt : term_at, kill_sent ? std::nullopt : kill_at})
      if (deadline) timeout = std::min(timeout, std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now()));
    for (int sig : relay.wait(timeout)) {
      if (sig == SIGCHLD) continue;
      spdlog::info("launcher: forwarding {} to the workers", signal_name(sig));
      signal_all(children, sig);
    }
  }
  return first_failure.value_or(0);
}

void check_options(const LaunchOptions& o, const std::vector<std::string>& argv) {
  auto fail = [](const std::string& what) { throw WorldError("launcher: " + what); };
  if (argv.empty() || argv[0].empty()) fail("no program to run");
  if (o.nproc_per_node < 1) fail("--nproc-per-node is " + std::to_string(o.nproc_per_node) + "; it must be >= 1");
  if (o.nnodes < 1) fail("--nnodes is " + std::to_string(o.nnodes) + "; it must be >= 1");
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    fail("--node-rank is " + std::to_string(o.node_rank) + "; it must be in 0.." + std::to_string(o.nnodes - 1));
  if (o.master_addr.empty()) fail("--master-addr is empty");
  if (o.master_port < 1 || o.master_port > 65535)
    fail("--master-port is " + std::to_string(o.master_port) + "; it must be a TCP port (1..65535)");
  if (o.grace.count() < 0) fail("the grace period is negative");
  if (static_cast<int64_t>(o.nnodes) * o.nproc_per_node > 1'000'000) fail("the world size is unreasonably large");
}

bool is_launcher_flag(std::string_view arg, bool& takes_next) {
  static constexpr std::array<std::string_view, 5> kFlags{"--nproc-per-node", "--nnodes", "--node-rank",
                                                          "--master-addr", "--master-port"};
  for (std::string_view flag : kFlags) {
    if (arg == flag) return takes_next = true;
    if (arg.size() > flag.size() && arg.substr(0, flag.size()) == flag && arg[flag.size()] == '=') {
      takes_next = false;
      return true;
    }
  }
  return false;
}

}  // namespace

int launch_workers(const LaunchOptions& options, const std::vector<std::string>& argv) {
  check_options(options, argv);
  SignalRelay relay;  // before the first spawn: a signal from now on reaches every started worker
  const int first_rank = options.node_rank * options.nproc_per_node;
  spdlog::info("launcher: starting {} workers (ranks {}..{} of {}), master {}:{}", options.nproc_per_node, first_rank,
               first_rank + options.nproc_per_node - 1, options.nnodes * options.nproc_per_node, options.master_addr,
               options.master_port);
  std::vector<Child> children;
  for (int i = 0; i < options.nproc_per_node; ++i) {
    try {
      children.push_back({first_rank + i, spawn_child(options, argv, i), true});
    } catch (const WorldError& e) {
      spdlog::error("{}", e.what());
      supervise(children, relay, options.grace, 1);
      throw;
    }
  }
  return supervise(children, relay, options.grace);
}

namespace {
// A SLURM count or index, the whole text: atoi read garbage as 0, and the check below was skipped.
int slurm_number(const char* name, const char* text) {
  int value = 0;
  const char* end = text + std::strlen(text);
  const auto [ptr, ec] = std::from_chars(text, end, value);
  if (ec != std::errc() || ptr != end || value < 0) {
    throw WorldError(fmt::format("{}='{}' is not a number of tasks or nodes: this is not a job step SLURM started "
                                 "(unset it, or run under srun)", name, text));
  }
  return value;
}
}  // namespace

void check_launch_under_slurm(const LaunchOptions& options, const GetEnv& getenv) {
  const char* tasks_text = getenv("SLURM_STEP_NUM_TASKS");
  if (tasks_text == nullptr || *tasks_text == '\0') return;
  const int tasks = slurm_number("SLURM_STEP_NUM_TASKS", tasks_text);
  if (tasks <= 1) return;
  const char* procid = getenv("SLURM_PROCID");
  const char* nodes_text = getenv("SLURM_STEP_NUM_NODES");
  // Each task a node of its own: as many tasks as nodes in the step, and this task's --node-rank
  // its task number (with one task per node, SLURM_PROCID counts the step's nodes).
  const bool one_task_per_node =
      options.nnodes == tasks &&
      (nodes_text == nullptr || *nodes_text == '\0' || slurm_number("SLURM_STEP_NUM_NODES", nodes_text) == tasks) &&
      (procid == nullptr || *procid == '\0' || slurm_number("SLURM_PROCID", procid) == options.node_rank);
  if (one_task_per_node) return;
  throw WorldError(fmt::format(
      "--nproc-per-node {} inside an srun step of {} tasks (this is task {}) with --nnodes {} --node-rank {}: every "
      "task would start its own {}-rank job on the same port and output folder. Either let srun start every rank "
      "(srun --ntasks-per-node=<GPUs per node> gpipe_runner ... without --nproc-per-node; scripts/submit_gpipe_*.sh "
      "do this), or run one task per node and give each its node: srun --ntasks-per-node=1 bash -c 'gpipe_runner "
      "--nproc-per-node N --nnodes $SLURM_STEP_NUM_NODES --node-rank $SLURM_PROCID --master-addr <first node> ...'",
      options.nproc_per_node, tasks, procid != nullptr ? procid : "?", options.nnodes, options.node_rank,
      options.nnodes * options.nproc_per_node));
}

std::vector<std::string> strip_launcher_flags(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--") {
      out.insert(out.end(), argv.begin() + static_cast<std::ptrdiff_t>(i), argv.end());
      break;
    }
    bool takes_next = false;
    if (!is_launcher_flag(argv[i], takes_next)) {
      out.push_back(argv[i]);
      continue;
    }
    if (takes_next) ++i;  // its value
  }
  return out;
}

std::string self_executable_path() {
  std::string path(256, '\0');
  for (;;) {
    const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size());
    if (n < 0) throw WorldError(std::string("cannot read /proc/self/exe: ") + std::strerror(errno));
    if (static_cast<size_t>(n) < path.size()) {
      path.resize(static_cast<size_t>(n));
      return path;
    }
    path.resize(path.size() * 2);
  }
}

}  // namespace gpipe
