// Cross-process bubble filling on one GPU (issue 25): a daemon per GPU (orion-gpud) hands each
// process on that GPU its shared pages; the pipeline process publishes its idle windows (bubbles)
// in one of them; each best-effort process admits or holds its own launches against that page and
// its grant, in the launching thread, with no round trip per kernel. The daemon decides grants
// (leases, revocation when a client dies, free running when the pipeline is gone); it is never on
// the launch path, and the pipeline never waits for it.
//
//   pipeline process ── publish_window()/heartbeat() ──► PipelinePage (memfd, written by it only)
//                                                              │ read-only mapping
//   orion-gpud ── GrantBook::tick() ──► GrantPage per client ──┤
//                                                              ▼
//   best-effort process ── admit(window, grant, now, kernel, in flight) ──► run | hold
//
// Times are CLOCK_MONOTONIC nanoseconds, the same clock in every process of the machine.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpud {

// 2: a usage page per best-effort client; 3: the observer role (status without a grant);
// 4: a status request carries a number its reply echoes.
inline constexpr uint32_t kProtocolVersion = 4;
// A client's message larger than this is refused (the connection is closed with an error).
inline constexpr size_t kMaxMessageBytes = 4096;
// The daemon's replies may be longer (a status of max_clients clients), still bounded: a client
// refuses a longer one. Well under a Unix socket's default send buffer (net.core.wmem_default).
inline constexpr size_t kMaxReplyBytes = 64 * 1024;
inline constexpr uint32_t kPageMagic = 0x4f475044;  // "OGPD"

int64_t monotonic_ns();

// ---- shared pages -------------------------------------------------------------------------------
// Written by one process each, read by others through a read-only mapping. Only lock-free atomics
// of fixed width, so the layout is the same in every process (static_asserts in shared_pages.cpp).

// The pipeline's page: its heartbeat and the current or next idle window. A window is published
// under a sequence lock (seq odd while it is written), so a reader never sees the open of one
// window with the close of another.
struct PipelinePage {
  uint32_t magic;
  uint32_t version;
  std::atomic<uint64_t> seq;
  std::atomic<int64_t> window_open_ns;
  std::atomic<int64_t> window_close_ns;
  std::atomic<uint64_t> windows_published;
  std::atomic<int64_t> heartbeat_ns;  // 0: no pipeline has attached
  std::atomic<int64_t> pipeline_pid;
  // Idle time offered so far: each window's length once (a window published again with the same
  // open, e.g. cut short by demand, counts its new length instead).
  std::atomic<int64_t> window_ns_published;
};

enum class GrantMode : uint32_t {
  kGated = 0,    // a live pipeline: run only inside its published windows
  kFree = 1,     // no pipeline, or its heartbeat is stale: run freely
  kRevoked = 2,  // the daemon took the grant back
};

// One best-effort client's grant, written by the daemon only.
struct GrantPage {
  uint32_t magic;
  uint32_t version;
  std::atomic<uint64_t> epoch;            // bumped at every change of mode or budget
  std::atomic<uint32_t> mode;             // GrantMode
  std::atomic<int64_t> lease_expiry_ns;   // the daemon renews it every tick; past it: fallback
  std::atomic<int64_t> inflight_budget_ns;  // best-effort work allowed in flight in a window (one longer kernel may go alone)
};

// One best-effort client's account of what its admission let through, written by that client
// alone (read-write mapping), read by the daemon for `orion-gpud status` (bubbles filled).
struct UsagePage {
  uint32_t magic;
  uint32_t version;
  std::atomic<uint64_t> launches_admitted;
  std::atomic<int64_t> admitted_kernel_ns;  // their estimated lengths (a kernel of unknown length: 0)
};
struct UsageView {
  uint64_t launches_admitted = 0;
  int64_t admitted_kernel_ns = 0;
};

struct WindowView {
  int64_t open_ns = 0;
  int64_t close_ns = 0;
  uint64_t windows_published = 0;
  int64_t heartbeat_ns = 0;
  int64_t window_ns_published = 0;
  // No consistent snapshot within the read's budget (the writer was mid-publication): the fields
  // are empty; the daemon keeps its previous snapshot, a best-effort launch holds (admit).
  bool torn = false;
};
struct GrantView {
  GrantMode mode = GrantMode::kRevoked;
  uint64_t epoch = 0;
  int64_t lease_expiry_ns = 0;
  int64_t inflight_budget_ns = 0;
  // read_grant found the daemon writing the page all along (its read budget spent): nothing in
  // it can be used. admit() holds: "lease expired" would let a fallback=pass client run beside a
  // live, gated pipeline whenever the daemon is preempted mid-write. A reader that must not hold
  // for ever behind a daemon killed mid-write keeps the last good lease (GpudPolicy does).
  bool torn = false;
};

// read_grant for a reader that must not hold for ever behind a daemon killed mid-write: a torn
// read holds (torn) only while the lease of the last untorn grant this reader saw runs; past it,
// an empty grant (lease 0: expired), so that admit() applies the reader's fallback as for any
// daemon gone. `last_good_lease_ns` is the reader's own (0 before its first untorn read), written
// only when a renewal changed it: threads launching at once can share it.
GrantView read_grant_keeping_lease(const GrantPage& page, int64_t now_ns, std::atomic<int64_t>& last_good_lease_ns);

void init_pipeline_page(PipelinePage& page);
void init_grant_page(GrantPage& page);
void init_usage_page(UsagePage& page);
// The best-effort side, after admit() said run inside a window (Decision::in_window): two relaxed
// adds on the client's own cache line.
void record_admitted(UsagePage& page, int64_t kernel_ns);
UsageView read_usage(const UsagePage& page);
// The pipeline's side: one window [open, close) (open may lie in the future), and its liveness.
void publish_window(PipelinePage& page, int64_t open_ns, int64_t close_ns);
void heartbeat(PipelinePage& page, int64_t now_ns);
// Consistent snapshots (the window's two ends from the same publication). Each call spins at
// most 50 us on a page being written: past that a window reads as torn (empty fields, `torn`
// set) and a grant as revoked with an expired lease, so neither a writer killed mid-publication
// nor one that keeps the page odd stalls the reader.
WindowView read_window(const PipelinePage& page);
GrantView read_grant(const GrantPage& page);
void write_grant(GrantPage& page, const GrantView& grant);
// The daemon's, once a pipeline left and again when the next attaches: an even sequence and an
// empty page. The page is reused, so the daemon refuses a new pipeline while a previous pipeline
// process that left still runs (it may still map the page writable); see daemon.cpp.
void reset_pipeline_page(PipelinePage& page);

// ---- admission: the best-effort side, in the launching thread -----------------------------------
enum class Fallback {
  kHold,         // the daemon is gone (lease expired): hold best-effort work
  kPassThrough,  // the daemon is gone: run it anyway (the pipeline is no longer protected)
};
struct AdmissionConfig {
  int64_t stale_after_ns = 200'000'000;          // a pipeline heartbeat older than this: gone
  int64_t guard_ns = 50'000;                     // kept free before a window closes
  int64_t unknown_kernel_min_window_ns = 5'000'000;  // a kernel of unknown length needs this much
  // A kernel longer than the grant's in-flight budget goes alone (nothing else in flight) if it
  // fits what is left of the window; > 0: and only if it is at most this long (what a window cut
  // short by the pipeline's demand can make the pipeline wait behind). 0: no such cap (a capped
  // kernel would wait for the job's next synchronisation, which releases it window or not).
  int64_t max_alone_ns = 0;
  Fallback fallback = Fallback::kHold;
};
enum class Verdict { kRun, kHold };
struct Decision {
  Verdict verdict;
  const char* reason;  // static text, for counters and logs
  bool in_window = false;  // run, inside the pipeline's window (what filling its bubbles counts)
};
// kernel_ns < 0: its length is unknown. inflight_ns: best-effort work already launched and not
// yet done (the caller's estimate).
Decision admit(const WindowView& window, const GrantView& grant, int64_t now_ns, int64_t kernel_ns,
               int64_t inflight_ns, const AdmissionConfig& config);

// ---- the daemon's decisions, a state machine under an explicit clock -----------------------------
// kObserver: asks for status only (`orion-gpud status`, a monitor): no pages, no grant, not one of
// the GPU's clients (status counts observers apart), and its leaving revokes nothing.
enum class Role { kPipeline, kBestEffort, kObserver };
const char* to_string(Role role);
std::optional<Role> role_from_string(const std::string& text);

struct GrantConfig {
  int64_t lease_ns = 500'000'000;
  int64_t stale_after_ns = 200'000'000;
  int64_t inflight_budget_ns = 2'000'000;
};
class GrantBook {
 public:
  explicit GrantBook(GrantConfig config) : config_(config) {}
  // Throws ProtocolError when a second pipeline asks (one per GPU).
  int add(Role role, pid_t pid, const std::string& name, int64_t now_ns);
  void remove(int id, const std::string& why);
  // Renews every best-effort lease and sets each grant's mode from the pipeline's page.
  void tick(const WindowView& pipeline, int64_t now_ns);
  GrantView grant(int id) const;
  bool has_pipeline() const { return pipeline_id_.has_value(); }
  nlohmann::json status(const WindowView& pipeline, int64_t now_ns) const;

 private:
  struct Client {
    Role role;
    pid_t pid;
    std::string name;
    int64_t since_ns;
    GrantView grant;
  };
  GrantConfig config_;
  std::map<int, Client> clients_;
  std::optional<int> pipeline_id_;
  int next_id_ = 1;
  uint64_t revoked_ = 0;
  std::vector<std::string> recent_departures_;
};

// ---- the daemon -----------------------------------------------------------------------------------
struct ProtocolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct DaemonError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct DaemonOptions {
  std::string gpu;                   // the GPU's UUID (nvidia-smi -L), the daemon's identity
  std::filesystem::path dir;         // runtime folder; default_runtime_dir() when empty
  std::vector<uid_t> allowed_uids;   // besides the daemon's own uid
  GrantConfig grants;
  int64_t tick_ns = 10'000'000;      // lease renewal and liveness checks
  int64_t hello_timeout_ns = 1'000'000'000;  // a connection that says nothing is closed
  size_t max_clients = 64;
};
// $ORION_GPUD_DIR, else $XDG_RUNTIME_DIR/orion-gpud, else /tmp/orion-gpud-<uid>.
std::filesystem::path default_runtime_dir();
std::filesystem::path socket_path(const std::filesystem::path& dir, const std::string& gpu);

class Daemon {
 public:
  // Takes the GPU's lock and binds its socket; throws DaemonError naming what is wrong (another
  // daemon holds the GPU, an unsafe folder, a bad UUID).
  explicit Daemon(DaemonOptions options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  // Serves until `stop` is set (checked every tick) or a fatal error.
  void run(const std::atomic<bool>& stop);
  const std::filesystem::path& socket() const { return socket_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::filesystem::path socket_;
};

// ---- a client -------------------------------------------------------------------------------------
class Client {
 public:
  // Connects, says hello and maps the pages the daemon hands over; throws ProtocolError with the
  // daemon's reason (refused uid, version mismatch, a pipeline already attached) or a timeout.
  // Every wait (the connect, when the daemon's backlog is full; the hello; the reply) ends within
  // timeout_ns in all. The daemon must run as this process's uid or as root (SO_PEERCRED on the
  // connected socket): anyone else's socket is refused before the hello.
  static Client connect(const std::filesystem::path& dir, const std::string& gpu, Role role, const std::string& name,
                        int64_t timeout_ns = 2'000'000'000);
  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;
  ~Client();

  int id() const { return id_; }  // 0 for an observer
  Role role() const { return role_; }
  const PipelinePage& pipeline() const;  // not for an observer
  // The pipeline role only. Not inherited by fork(); after this client leaves (closes, execs) the
  // daemon attaches no other pipeline until this process exits (or attaches again itself).
  PipelinePage& pipeline_writable();
  const GrantPage& grant() const;     // the best-effort role only
  UsagePage& usage();                 // the best-effort role only: its own counters
  // The daemon's view of clients, grants and windows (orion-gpud status), within timeout_ns. Each
  // request is numbered: the late reply to an earlier request that timed out is skipped.
  nlohmann::json status(int64_t timeout_ns = 2'000'000'000);
  // False once the daemon hung up (it stopped, died or dropped this client): one poll() with a
  // zero timeout, no message, safe from any thread. Its pages are then read or written by no one;
  // a new Client::connect reaches a restarted daemon. True while the connection stands, even if
  // the daemon is stuck (its lease then runs out: see admit()).
  bool daemon_alive() const;
  // Closes the socket of a connection the daemon hung up on, keeping the pages mapped (other
  // threads may still read them): a reconnecting client must not keep one descriptor per daemon
  // restart. daemon_alive() is false from then on; not concurrently with daemon_alive().
  void close_connection();

 private:
  Client() = default;
  int fd_ = -1;
  std::filesystem::path socket_;  // for error messages
  int id_ = 0;
  Role role_ = Role::kBestEffort;
  PipelinePage* pipeline_ = nullptr;
  GrantPage* grant_ = nullptr;
  UsagePage* usage_ = nullptr;
  uint64_t requests_ = 0;  // status requests sent
};

}  // namespace gpud
