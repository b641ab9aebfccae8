// orion-gpud's server: one per GPU (a lock on the GPU's UUID), a Unix SOCK_SEQPACKET socket only
// its owner (and uids allowed by name) can use, a versioned hello, every message validated, every
// wait bounded (a tick, a hello deadline), and each client watched through a pidfd and its socket,
// so a client that dies or execs (its close-on-exec socket closes) loses its grant within a tick.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "gpud/gpud.h"
#include "peer.h"
#include "shared_memory.h"
#include "socket_io.h"

namespace gpud {

namespace fs = std::filesystem;

std::filesystem::path default_runtime_dir() {
  if (const char* d = std::getenv("ORION_GPUD_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x != nullptr && *x != '\0') return fs::path(x) / "orion-gpud";
  return fs::path(fmt::format("/tmp/orion-gpud-{}", geteuid()));
}

std::filesystem::path socket_path(const std::filesystem::path& dir, const std::string& gpu) {
  return dir / fmt::format("gpu-{}.sock", gpu);
}

namespace {

constexpr size_t kMaxWaitingConnections = 16;
// Connections of refused uids waiting to read their refusal: capped apart, so that another user
// reconnecting in a loop cannot fill the allowed peers' waiting slots.
constexpr size_t kMaxRefusedConnections = 4;
// Observers (status only) are capped apart from the GPU's clients, so monitors cannot take a
// client's place, nor clients an operator's `orion-gpud status`.
constexpr size_t kMaxObservers = 8;

void check_gpu_name(const std::string& gpu) {
  const bool ok = !gpu.empty() && gpu.size() <= 80 && std::all_of(gpu.begin(), gpu.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
  if (!ok) {
    throw DaemonError(fmt::format("--gpu '{}' is not a GPU UUID (letters, digits, '-', '_', '.'; see nvidia-smi -L)", gpu));
  }
}

// The runtime folder: ours, and writable by no one else (anyone who can write it can replace the
// socket). Other allowed uids need to traverse it: 0711 then, else 0700.
void prepare_dir(const fs::path& dir, bool others_allowed) {
  std::error_code ec;
  if (dir.has_parent_path()) fs::create_directories(dir.parent_path(), ec);
  // Made 0700 from the start (create_directories would take the umask's mode, and until the
  // chmod below another user could plant a link or folder where the lock or socket goes).
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    throw DaemonError(fmt::format("cannot make the runtime folder {}: {}", dir.string(), std::strerror(errno)));
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw DaemonError(fmt::format("runtime folder {} is not a folder ({})", dir.string(), std::strerror(errno)));
  }
  if (st.st_uid != geteuid()) {
    throw DaemonError(fmt::format("runtime folder {} belongs to uid {}, not to this daemon's uid {}: use "
                                  "--dir or ORION_GPUD_DIR with a folder of your own",
                                  dir.string(), st.st_uid, geteuid()));
  }
  if (chmod(dir.c_str(), others_allowed ? 0711 : 0700) != 0) {
    throw DaemonError(fmt::format("cannot restrict {}: {}", dir.string(), std::strerror(errno)));
  }
}

std::string exited_connector(pid_t pid) {
  return fmt::format("the process that opened this connection (pid {}) has exited: connect from the process that "
                     "uses the connection", pid);
}

}  // namespace

struct Daemon::Impl {
  struct Connection {
    int fd = -1;
    int pidfd = -1;
    pid_t pid = 0;
    bool greeted = false;  // its hello was answered with a welcome
    int id = 0;            // its GrantBook id (0 for an observer, which holds no grant)
    Role role = Role::kBestEffort;
    int64_t hello_deadline_ns = 0;
    // Set when the peer is refused at accept (uid, too many clients): the reason goes out as the
    // answer to its first message, so the close does not reset a connection with unread data (the
    // peer would see ECONNRESET instead of the reason).
    std::string refusal;
    bool uid_refused = false;  // refused at accept for its uid (capped apart from allowed peers)
    SharedPage grant;
    SharedPage usage;  // best effort: the client writes it, status reads it
  };

  DaemonOptions options;
  int lock_fd = -1;
  int listen_fd = -1;
  WindowView last_window;  // the last consistent read of the pipeline page (a torn read keeps it)
  // One pipeline page for the daemon's life, reset for each pipeline that attaches. A page can be
  // reused only once no process can still write it: a pipeline that left its connection (closed
  // it, said bye, exec'd) while its process lives on may still hold a writable mapping, so the
  // next pipeline is refused, by name, until that process exits (tracked by its pidfd). The same
  // process may attach again (its old mapping is its own; after an exec it has none), and the
  // client's mapping is not inherited by fork (MADV_DONTFORK, map_received_page), so no other
  // process holds one. Chosen over a fresh page per pipeline, which would need every best-effort
  // client to notice the switch and map the new page in its launch path.
  SharedPage pipeline_page;
  int departed_pipeline_pidfd = -1;
  pid_t departed_pipeline_pid = 0;  // 0: none
  GrantBook book;
  std::vector<Connection> connections;

  explicit Impl(DaemonOptions o) : options(std::move(o)), book(options.grants) {}
  // Runs also when Daemon's constructor throws half way: the lock, the socket and its file go.
  ~Impl() {
    forget_departed_pipeline();
    for (auto& c : connections) {
      if (c.pidfd >= 0) close(c.pidfd);
      close(c.fd);
    }
    if (listen_fd >= 0) {
      close(listen_fd);
      unlink(bound_socket.c_str());
    }
    if (lock_fd >= 0) close(lock_fd);
  }
  std::filesystem::path bound_socket;
  // accept4 failed for lack of descriptors (EMFILE): the listening socket stays readable, so it
  // is left out of poll until this time instead of spinning.
  int64_t accept_paused_until_ns = 0;
  // Refusals logged this second, and since when (a refused uid connecting in a loop must not
  // stall the tick on a slow stderr: the log is the daemon's one unbounded wait).
  int64_t refusal_log_since_ns = 0;
  int refusals_logged = 0, refusals_unlogged = 0;

  PipelinePage& pipeline() { return *static_cast<PipelinePage*>(pipeline_page.data()); }

  // Bubbles filled: each best-effort client's admitted launches and their estimated kernel time
  // (from its usage page), and their sum over the idle time the pipeline has offered.
  // The pipeline page now, or the last consistent read when this one is torn (a publication in
  // progress, or a writer that keeps the page odd): a torn read must not look like a pipeline gone.
  WindowView current_window() {
    const WindowView now = read_window(pipeline());
    if (!now.torn) last_window = now;
    return last_window;
  }

  void add_usage(nlohmann::json& status, const WindowView& window) {
    double admitted_ns = 0;  // the clients' own counters, any int64 each: summed in double
    for (nlohmann::json& j : status["clients"]) {
      if (j["role"] != to_string(Role::kBestEffort)) continue;
      const int id = j["id"].get<int>();
      for (const Connection& c : connections) {
        if (c.id != id || c.usage.data() == nullptr) continue;
        const UsageView u = read_usage(*static_cast<const UsagePage*>(c.usage.data()));
        j["launches_admitted"] = u.launches_admitted;
        j["admitted_kernel_ms"] = static_cast<double>(u.admitted_kernel_ns) / 1e6;
        admitted_ns += static_cast<double>(u.admitted_kernel_ns);
      }
    }
    if (status["pipeline"].is_object()) {
      status["pipeline"]["window_ms_published"] = static_cast<double>(window.window_ns_published) / 1e6;
      status["pipeline"]["filled_share"] =
          window.window_ns_published > 0 ? admitted_ns / static_cast<double>(window.window_ns_published)
                                         : 0.0;
    }
  }

  bool allowed(uid_t uid) const {
    return uid == geteuid() ||
           std::find(options.allowed_uids.begin(), options.allowed_uids.end(), uid) != options.allowed_uids.end();
  }

  void forget_departed_pipeline() {
    if (departed_pipeline_pidfd >= 0) close(departed_pipeline_pidfd);
    departed_pipeline_pidfd = -1;
    departed_pipeline_pid = 0;
  }

  // The pid of a pipeline that left but still lives (see pipeline_page), else 0.
  pid_t departed_pipeline_alive() {
    if (departed_pipeline_pid != 0 && !process_alive(departed_pipeline_pidfd, departed_pipeline_pid)) {
      forget_departed_pipeline();
    }
    return departed_pipeline_pid;
  }

  // daemon_stopping: the daemon itself goes (its leases would lapse anyway): grants read revoked
  // with an expired lease, so each client's fallback applies at once.
  void drop(size_t index, const std::string& why, bool daemon_stopping = false) {
    Connection& c = connections[index];
    if (c.greeted && c.role == Role::kObserver) {
      spdlog::debug("orion-gpud: observer pid {} left: {}", c.pid, why);
    } else if (c.id != 0) {  // booked (a hello whose welcome could not be sent too)
      spdlog::info("orion-gpud: {} client {} (pid {}) left: {}", to_string(c.role), c.id, c.pid, why);
      if (c.role == Role::kBestEffort && c.grant.data() != nullptr) {
        // Revoked, if it still looks. Dropped by a live daemon, for one lease: it holds (a lease of
        // 0 reads as a daemon gone, and a fallback=pass client would run beside the pipeline) and
        // connects again meanwhile. The daemon stopping: its fallback at once.
        GrantView revoked;
        revoked.lease_expiry_ns = daemon_stopping ? 0 : monotonic_ns() + options.grants.lease_ns;
        write_grant(*static_cast<GrantPage*>(c.grant.data()), revoked);
      }
      if (c.role == Role::kPipeline) {
        reset_pipeline_page(pipeline());  // empty until the next one (no grant is gated meanwhile)
        last_window = WindowView{};
        // Only a welcomed pipeline received the page, so only it may still write it.
        if (c.greeted && process_alive(c.pidfd, c.pid)) {
          forget_departed_pipeline();
          departed_pipeline_pidfd = std::exchange(c.pidfd, -1);
          departed_pipeline_pid = c.pid;
        }
      }
      book.remove(c.id, why);
    }
    if (c.pidfd >= 0) close(c.pidfd);
    close(c.fd);
    connections.erase(connections.begin() + static_cast<std::ptrdiff_t>(index));
  }

  // Connections that have not been welcomed yet (the one being greeted among them): peers of an
  // allowed uid before their hello (`refused` false; one whose connector exited among them), or
  // of a refused uid (true).
  size_t waiting_connections(bool refused) const {
    return static_cast<size_t>(std::count_if(connections.begin(), connections.end(), [refused](const Connection& c) {
      return !c.greeted && c.uid_refused == refused;
    }));
  }
  size_t waiting_connections() const { return waiting_connections(false) + waiting_connections(true); }

  size_t count_of(Role role) const {
    return static_cast<size_t>(std::count_if(connections.begin(), connections.end(), [role](const Connection& c) {
      return c.greeted && c.role == role;
    }));
  }
  size_t observer_count() const { return count_of(Role::kObserver); }

  void refuse(int fd, const std::string& why) {
    try {
      io::send_message(fd, io::error_message(why), {}, kMaxReplyBytes);
    } catch (const ProtocolError&) {
    }
  }

  void accept_one(int64_t now) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        spdlog::warn("orion-gpud: cannot accept a connection ({}): pausing accepts for 100 ms", std::strerror(errno));
        accept_paused_until_ns = now + 100'000'000;
      }
      return;
    }
    // Connections that have not said hello are capped apart from clients, and refused ones apart
    // from allowed ones, so a flood of silent or refused peers can neither use up the daemon's
    // descriptors nor keep an allowed client from being heard.
    uid_t uid = 0;
    const pid_t pid = peer_pid_uid(fd, &uid);
    if (pid <= 0 || waiting_connections(!allowed(uid)) >= (allowed(uid) ? kMaxWaitingConnections : kMaxRefusedConnections)) {
      close(fd);
      return;
    }
    Connection c;
    if (!allowed(uid)) {
      if (now - refusal_log_since_ns >= 1'000'000'000) {
        if (refusals_unlogged > 0) spdlog::warn("orion-gpud: {} more refusals not logged", refusals_unlogged);
        refusal_log_since_ns = now;
        refusals_logged = refusals_unlogged = 0;
      }
      if (++refusals_logged <= 5) {
        spdlog::warn("orion-gpud: refused pid {} of uid {} (not in --allow-uid)", pid, uid);
      } else {
        ++refusals_unlogged;
      }
      c.refusal = fmt::format("uid {} is not allowed by this orion-gpud (started by uid {}; it allows more with "
                              "--allow-uid)", uid, geteuid());
      c.uid_refused = true;
    }  // how many clients and observers it serves is checked at the hello, by role
    c.fd = fd;
    c.pid = pid;
    if (!c.uid_refused) {
      bool gone = false;
      c.pidfd = peer_pidfd(fd, pid, &gone);
      if (gone) c.refusal = exited_connector(pid);
    }
    c.hello_deadline_ns = now + options.hello_timeout_ns;
    connections.push_back(std::move(c));
  }

  // Returns an error text to send before dropping the connection, or "" when all went well.
  std::string on_hello(Connection& c, const nlohmann::json& m, int64_t now) {
    if (!m.contains("version") || !m["version"].is_number_unsigned()) return "hello without an unsigned 'version'";
    if (m["version"].get<uint64_t>() != kProtocolVersion) {
      return fmt::format("protocol version {}, this orion-gpud speaks {}: run the same release of both",
                         m["version"].get<uint64_t>(), kProtocolVersion);
    }
    if (!m.contains("role") || !m["role"].is_string()) return "hello without a string 'role'";
    const auto role = role_from_string(m["role"].get<std::string>());
    if (!role) {
      return fmt::format("unknown role '{}' (pipeline, best_effort or observer)", m["role"].get<std::string>());
    }
    // The pid the sender sees of itself. It may differ from the socket's (SO_PEERCRED translates
    // it into the daemon's PID namespace: a client in a container, Enroot/Pyxis under SLURM); the
    // socket's is the one the daemon trusts and watches (pidfd), this one is only logged.
    if (!m.contains("pid") || !m["pid"].is_number_integer() || m["pid"].get<int64_t>() <= 0) {
      return "hello must carry the sender's pid (a positive integer)";
    }
    if (m["pid"].get<int64_t>() != c.pid) {
      spdlog::info("orion-gpud: pid {} calls itself {} (another PID namespace)", c.pid, m["pid"].get<int64_t>());
    }
    if (!m.contains("name") || !m["name"].is_string() || m["name"].get<std::string>().size() > 64) {
      return "hello needs a 'name' of at most 64 characters";
    }
    // Names go into the daemon's log and status: no control characters (a newline would forge
    // log lines).
    for (const char ch : m["name"].get<std::string>()) {
      if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) return "hello's 'name' must hold no control characters";
    }
    const std::string name = m["name"].get<std::string>();
    // The daemon trusts the process that connected, and watches it: a connection handed on (over
    // SCM_RIGHTS, or inherited) by a process that has since exited belongs to no one it can watch.
    if (!process_alive(c.pidfd, c.pid)) return exited_connector(c.pid);
    const size_t observers = observer_count();
    if (*role == Role::kObserver && observers >= kMaxObservers) {
      return fmt::format("orion-gpud serves at most {} observers at once (status requests): try again", kMaxObservers);
    }
    // Best-effort clients only: the one pipeline a GPU has always gets in (crowded out by
    // best-effort connections, it could not publish, and they would run free beside it).
    if (*role == Role::kBestEffort && count_of(Role::kBestEffort) >= options.max_clients) {
      return fmt::format("orion-gpud serves at most {} best-effort clients", options.max_clients);
    }
    if (*role == Role::kObserver) {  // status only: no pages, no grant, nothing to revoke (its
      c.role = *role;                // socket's hang-up ends it)
      try {
        io::send_message(c.fd, {{"type", "welcome"}, {"version", kProtocolVersion}, {"client_id", 0}, {"gpu", options.gpu}},
                         {}, kMaxReplyBytes);
      } catch (const ProtocolError& e) {
        return e.what();
      }
      c.greeted = true;
      spdlog::debug("orion-gpud: observer attached (pid {}, '{}')", c.pid, name);
      return "";
    }
    if (*role == Role::kPipeline && !book.has_pipeline()) {
      const pid_t departed = departed_pipeline_alive();
      if (departed != 0 && departed != c.pid) {
        return fmt::format("the previous pipeline (pid {}) left but its process still runs and may still write the "
                           "pipeline page: a new pipeline can attach once it exits (end it, or wait)",
                           departed);
      }
      forget_departed_pipeline();
    }
    try {
      c.id = book.add(*role, c.pid, name, now);
    } catch (const ProtocolError& e) {
      return e.what();
    }
    c.role = *role;
    std::vector<int> fds;
    std::vector<int> to_close;
    try {
      if (c.role == Role::kPipeline) {
        reset_pipeline_page(pipeline());  // whatever the same process wrote after it left
        last_window = WindowView{};
        pipeline().pipeline_pid.store(c.pid, std::memory_order_release);
        fds.push_back(pipeline_page.fd());
      } else {
        c.grant = SharedPage("orion-gpud-grant");
        init_grant_page(*static_cast<GrantPage*>(c.grant.data()));
        write_grant(*static_cast<GrantPage*>(c.grant.data()), book.grant(c.id));
        c.grant.seal_writes_by_others();
        c.usage = SharedPage("orion-gpud-usage");
        init_usage_page(*static_cast<UsagePage*>(c.usage.data()));
        c.usage.forbid_more_seals();
        to_close.push_back(pipeline_page.open_read_only());
        to_close.push_back(c.grant.open_read_only());
        fds = to_close;
        fds.push_back(c.usage.fd());  // read-write: the client's own counters
      }
    } catch (const DaemonError& e) {
      for (int fd : to_close) close(fd);
      return std::string("orion-gpud could not make the client's pages: ") + e.what();
    }
    nlohmann::json welcome = {{"type", "welcome"},
                              {"version", kProtocolVersion},
                              {"client_id", c.id},
                              {"gpu", options.gpu},
                              {"lease_ms", static_cast<double>(options.grants.lease_ns) / 1e6},
                              {"stale_after_ms", static_cast<double>(options.grants.stale_after_ns) / 1e6}};
    std::string error;
    try {
      io::send_message(c.fd, welcome, fds, kMaxReplyBytes);
    } catch (const ProtocolError& e) {
      error = e.what();
    }
    for (int fd : to_close) close(fd);
    c.greeted = error.empty();
    if (error.empty()) spdlog::info("orion-gpud: {} client {} attached (pid {}, '{}')", to_string(c.role), c.id, c.pid, name);
    return error;
  }

  // One message from connection `index`; drops the connection when it must go.
  void on_readable(size_t index, int64_t now) {
    Connection& c = connections[index];
    io::Incoming in = io::receive_message(c.fd, -1, kMaxMessageBytes, /*accept_fds=*/false);
    switch (in.what) {
      case io::Received::kTimeout:
        return;
      case io::Received::kClosed:
        drop(index, "closed its connection (exit or exec)");
        return;
      case io::Received::kOversized:
      case io::Received::kMalformed:
        if (!c.refusal.empty()) break;  // the refusal is the answer, whatever was sent
        refuse(c.fd, in.error);
        drop(index, "sent " + in.error);
        return;
      case io::Received::kMessage:
        break;
    }
    if (!c.refusal.empty()) {
      const std::string why = c.refusal;
      refuse(c.fd, why);
      drop(index, why);
      return;
    }
    const std::string type = in.message["type"].get<std::string>();
    if (!c.greeted) {
      const std::string error = type == "hello" ? on_hello(c, in.message, now) : "the first message must be a hello";
      if (!error.empty()) {
        refuse(c.fd, error);
        drop(index, error);
      }
      return;
    }
    if (type == "status") {
      const WindowView window = current_window();
      nlohmann::json s = book.status(window, now);
      add_usage(s, window);
      s["type"] = "status";
      s["gpu"] = options.gpu;
      s["version"] = kProtocolVersion;
      s["observers"] = observer_count();
      // The request's number, so that a client whose earlier ask timed out tells that late reply
      // from this one.
      if (const auto r = in.message.find("request"); r != in.message.end() && r->is_number_unsigned()) {
        s["request"] = *r;
      }
      if (const pid_t departed = departed_pipeline_alive(); departed != 0) s["pipeline_refused_until_pid_exits"] = departed;
      try {
        io::send_message(c.fd, s, {}, kMaxReplyBytes);
      } catch (const ProtocolError&) {
        // A status too large for one message: say so rather than drop the client.
        refuse(c.fd, "status too large for one message");
      }
      return;
    }
    if (type == "bye") {
      drop(index, "said bye");
      return;
    }
    refuse(c.fd, fmt::format("unknown message type '{}'", type));
    drop(index, "sent an unknown message type");
    return;
  }

  void tick(int64_t now) {
    for (size_t i = connections.size(); i-- > 0;) {
      if (!connections[i].greeted && now >= connections[i].hello_deadline_ns) {
        refuse(connections[i].fd, !connections[i].refusal.empty()
                                      ? connections[i].refusal
                                      : fmt::format("no hello within {} ms", options.hello_timeout_ns / 1'000'000));
        drop(i, "no hello in time");
      }
    }
    const WindowView window = current_window();
    book.tick(window, now);
    for (Connection& c : connections) {
      if (c.greeted && c.role == Role::kBestEffort) {
        write_grant(*static_cast<GrantPage*>(c.grant.data()), book.grant(c.id));
      }
    }
  }
};

Daemon::Daemon(DaemonOptions options) {
  check_gpu_name(options.gpu);
  if (options.dir.empty()) options.dir = default_runtime_dir();
  prepare_dir(options.dir, !options.allowed_uids.empty());
  impl_ = std::make_unique<Impl>(options);
  const fs::path lock = options.dir / fmt::format("gpu-{}.lock", options.gpu);
  impl_->lock_fd = open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (impl_->lock_fd < 0) throw DaemonError(fmt::format("cannot open {}: {}", lock.string(), std::strerror(errno)));
  if (flock(impl_->lock_fd, LOCK_EX | LOCK_NB) != 0) {
    throw DaemonError(fmt::format("another orion-gpud serves GPU {} (it holds {}): one daemon per GPU",
                                  options.gpu, lock.string()));
  }
  socket_ = socket_path(options.dir, options.gpu);
  // Bound and listening under a temporary name, then renamed into place: a client never finds a
  // socket file that refuses connections (between bind and listen), and the swap replaces a
  // stale socket of a dead daemon atomically (we hold the GPU's lock).
  const fs::path temporary = socket_.string() + fmt::format(".{}.tmp", getpid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (temporary.string().size() >= sizeof addr.sun_path) {
    throw DaemonError(fmt::format("socket path {} is too long for a Unix socket: use a shorter --dir", socket_.string()));
  }
  std::strncpy(addr.sun_path, temporary.c_str(), sizeof addr.sun_path - 1);
  unlink(temporary.c_str());
  impl_->listen_fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  impl_->bound_socket = temporary;
  if (impl_->listen_fd < 0 || bind(impl_->listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      chmod(temporary.c_str(), options.allowed_uids.empty() ? 0600 : 0666) != 0 || listen(impl_->listen_fd, 16) != 0 ||
      rename(temporary.c_str(), socket_.c_str()) != 0) {
    throw DaemonError(fmt::format("cannot listen on {}: {}", socket_.string(), std::strerror(errno)));
  }
  impl_->bound_socket = socket_;
  impl_->pipeline_page = SharedPage("orion-gpud-pipeline");
  init_pipeline_page(impl_->pipeline());
  impl_->pipeline_page.forbid_more_seals();
}

Daemon::~Daemon() {
  if (!impl_) return;
  while (!impl_->connections.empty()) impl_->drop(impl_->connections.size() - 1, "the daemon stopped", /*daemon_stopping=*/true);
  // ~Impl closes the socket, unlinks its file and releases the lock.
}

void Daemon::run(const std::atomic<bool>& stop) {
  Impl& d = *impl_;
  int64_t next_tick = monotonic_ns();
  std::vector<pollfd> fds;
  while (!stop.load(std::memory_order_acquire)) {
    const int64_t now = monotonic_ns();
    if (now >= next_tick) {
      d.tick(now);
      next_tick = now + d.options.tick_ns;
    }
    fds.clear();
    fds.push_back({d.listen_fd, static_cast<short>(now >= d.accept_paused_until_ns ? POLLIN : 0), 0});
    for (const auto& c : d.connections) {
      fds.push_back({c.fd, POLLIN, 0});
      // -1 (none, or closed once its process exited before the hello): poll skips the entry.
      fds.push_back({c.pidfd, POLLIN, 0});
    }
    const int wait_ms = static_cast<int>(std::clamp<int64_t>((next_tick - now + 999'999) / 1'000'000, 0, 1000));
    const int rc = poll(fds.data(), fds.size(), wait_ms);
    if (rc < 0) {
      if (errno == EINTR) continue;
      throw DaemonError(fmt::format("poll: {}", std::strerror(errno)));
    }
    if (rc == 0) continue;
    const int64_t at = monotonic_ns();
    // Connections first, from the back (drop() erases), then new ones.
    for (size_t i = d.connections.size(); i-- > 0;) {
      const pollfd& sock = fds[1 + 2 * i];
      const pollfd& pid = fds[2 + 2 * i];
      if (pid.revents & POLLIN) {
        // Not yet greeted: whoever holds the connection now hears why at its hello (or at the
        // hello deadline it is dropped), instead of a reset with no reason.
        // Its pidfd is closed: a reaped process's pidfd reports POLLHUP even when not asked, and
        // poll would return at once until the hello.
        if (!d.connections[i].greeted) {
          Daemon::Impl::Connection& c = d.connections[i];
          c.refusal = exited_connector(c.pid);
          close(c.pidfd);
          c.pidfd = -1;
        } else {
          d.drop(i, "its process exited");
          continue;
        }
      }
      if (sock.revents & POLLIN) {
        try {
          d.on_readable(i, at);
        } catch (const std::exception& e) {  // one client's trouble never ends the daemon
          spdlog::error("orion-gpud: dropping a client after an error: {}", e.what());
          if (i < d.connections.size()) d.drop(i, e.what());
        }
      } else if (sock.revents & (POLLHUP | POLLERR)) {
        d.drop(i, "closed its connection (exit or exec)");
      }
    }
    if (fds[0].revents & POLLIN) d.accept_one(at);
  }
}

}  // namespace gpud
