// driver_model_check: does a driver answer the context-lifecycle probes the way the fake driver
// (tests/intercept/fake_cuda) models the real one? Each probe is a short driver-API program (a
// primary context's retains, reset and last release; a green context's create and destroy; a
// created context's destroy; the handles each leaves behind; captures; events across contexts;
// stream flags and priorities; a PTX kernel's launches in and out of its context;
// driver_model_probes.cpp) whose answer is one line of text.
// tests/intercept/fake_cuda/driver_model.json holds each probe's answer as the fake gives it, with
// where that belief comes from (cuda.h, the CUDA programming guide, or an assumption). A probe
// marked undefined_behaviour uses handles the driver may have freed: on a real driver its answer
// is recorded, never judged (--judge-undefined judges it, for the fake).
//   - ctest runs it on the fake driver, without and with the shim: the fake keeps the model the
//     file states, and the shim changes no answer (it must be transparent to them).
//   - scripts/gpu/check_driver_rules.sh (check f5) runs it on the real driver: a disagreement is
//     a rule the fake gets wrong (fix the fake and the file, then the shim's tests mean more);
//     --answers writes the real answers in the file's form.
// Every probe runs in a child process of its own, leading its own process group (killed after
// the probe): a probe that crashes the driver, hangs (bounded: --timeout-s) or fails to set up is
// an answer of its own, never the end of the run. The parent never calls the driver (CUDA does
// not survive a fork).
//
// usage: driver_model_check --expect FILE [--driver libcuda.so.1] [--only NAME]... [--answers OUT]
//                           [--judge-undefined] [--through-shim] [--timeout-s S] [--list]
// exit 0: every judged probe agrees, 1: some disagree, 2: bad arguments, file or driver.
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "driver_model_probes.h"

namespace {

using namespace driver_model;

// In the child: the probe's answer on `out`, then _exit (no atexit handler of a driver or shim
// that a probe may have left in a bad state).
[[noreturn]] void run_child(const std::string& driver_path, const Probe& probe, int out) {
  std::string answer;
  try {
    const Driver d = open_driver(driver_path);
    MUST(d, d.cuInit(0));
    CUdevice dev = 0;
    MUST(d, d.cuDeviceGet(&dev, 0));
    answer = probe(d, dev);
  } catch (const std::exception& e) {
    answer = e.what();
  }
  answer += '\n';
  size_t done = 0;
  while (done < answer.size()) {
    const ssize_t n = write(out, answer.data() + done, answer.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  _exit(0);
}

// Writes `j` to `path` through a temporary file renamed over it (a reader never sees half).
bool write_json(const std::string& path, const nlohmann::json& j) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

// A probe's text that is not the driver's answer: the probe could not ask.
bool is_an_answer(const std::string& text) {
  for (const char* failed : {"set-up failed:", "crashed:", "no answer"}) {
    if (text.rfind(failed, 0) == 0) return false;
  }
  return true;
}

// Reads what is in `fd` now (non-blocking) onto `text`; false once the writers are all gone.
bool read_available(int fd, std::string& text) {
  char buf[512];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0;  // EAGAIN: open but empty; 0: end of file
  }
}

// Runs one probe in a child; its answer, or what became of the child, within `timeout_s`. The
// child leads a process group of its own, which is killed whatever happens: a process the driver
// started (and that holds the pipe) neither delays the answer nor outlives the probe.
std::string run_probe(const std::string& driver_path, const Probe& probe, int timeout_s) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error(fmt::format("pipe2: {}", std::strerror(errno)));
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);
    close(fds[0]);
    run_child(driver_path, probe, fds[1]);
  }
  setpgid(pid, pid);  // also here: the group exists before the parent may need to kill it
  close(fds[1]);
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  bool open = true, exited = false;
  int status = 0;
  // Until the child has exited (its answer is in the pipe by then) or the deadline passes.
  while (!exited && std::chrono::steady_clock::now() < deadline) {
    if (open) {
      pollfd p{fds[0], POLLIN, 0};
      if (poll(&p, 1, 20) > 0) open = read_available(fds[0], text);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const pid_t r = waitpid(pid, &status, WNOHANG);
    exited = r == pid || (r < 0 && errno != EINTR);
  }
  if (open) read_available(fds[0], text);
  close(fds[0]);
  kill(-pid, SIGKILL);  // the group: the child if it hangs, anything it started
  if (!exited) {
    // A child stuck in the driver (uninterruptible) dies only when the driver lets go: waited for
    // 5 s at most, then left to init.
    for (int i = 0; i < 250 && waitpid(pid, &status, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return fmt::format("no answer within {} s (killed)", timeout_s);
  }
  if (WIFSIGNALED(status)) return fmt::format("crashed: {}", strsignal(WTERMSIG(status)));
  while (!text.empty() && text.back() == '\n') text.pop_back();
  if (text.empty()) return fmt::format("no answer (exit status {})", WEXITSTATUS(status));
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Runs the fake driver's context-lifecycle probes on a driver and compares each answer with "
               "tests/intercept/fake_cuda/driver_model.json"};
  std::string expect_path, driver_path = "libcuda.so.1";
  std::vector<std::string> only;
  int timeout_s = 20;
  bool list = false;
  bool through_shim = false;
  std::string answers_path;
  bool judge_undefined = false;
  app.add_option("--expect", expect_path, "driver_model.json: each probe's answer as the fake gives it")
      ->check(CLI::ExistingFile);
  app.add_option("--driver", driver_path, "the driver library to probe (a path, or a name for dlopen)");
  app.add_option("--only", only, "run only this probe (repeatable)");
  app.add_option("--timeout-s", timeout_s, "a probe without an answer by then is killed")->check(CLI::Range(1, 600));
  app.add_flag("--list", list, "print the probes' names and exit");
  app.add_option("--answers", answers_path,
                 "write the driver's answers here, in driver_model.json's form (a disagreeing probe keeps the "
                 "fake's answer as 'fake_answer'): what to copy into the file and the fake after a GPU run");
  app.add_flag("--judge-undefined", judge_undefined,
               "judge the probes marked undefined_behaviour too (on the fake, which must keep its stated answers)");
  app.add_flag("--through-shim", through_shim,
               "fail (exit 2) unless the driver's functions resolve into libgpu_scheduler.so (LD_PRELOAD)");
  CLI11_PARSE(app, argc, argv);

  if (list) {
    for (const auto& [name, probe] : probes()) std::printf("%s\n", name.c_str());
    return 0;
  }
  if (expect_path.empty()) {
    std::fprintf(stderr, "driver_model_check: give --expect tests/intercept/fake_cuda/driver_model.json\n");
    return 2;
  }
  nlohmann::json expected;
  try {
    std::ifstream in(expect_path);
    expected = nlohmann::json::parse(in).at("probes");
    if (!expected.is_object()) throw std::runtime_error("'probes' is not an object");
    for (const auto& [name, entry] : expected.items()) {
      if (probes().count(name) == 0) {
        throw std::runtime_error(fmt::format("it lists '{}', which this program does not have (--list)", name));
      }
      if (!entry.contains("expect") || !entry["expect"].is_string() || !entry.contains("why") ||
          !entry["why"].is_string()) {
        throw std::runtime_error(fmt::format("'{}' needs the strings 'expect' and 'why'", name));
      }
      if (entry.contains("undefined_behaviour") && !entry["undefined_behaviour"].is_boolean()) {
        throw std::runtime_error(fmt::format("'{}': 'undefined_behaviour' is true or false", name));
      }
    }
    for (const auto& [name, probe] : probes()) {
      if (!expected.contains(name)) throw std::runtime_error(fmt::format("it has no entry for the probe '{}'", name));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "driver_model_check: %s: %s\n", expect_path.c_str(), e.what());
    return 2;
  }
  for (const std::string& name : only) {
    if (probes().count(name) == 0) {
      std::fprintf(stderr, "driver_model_check: no probe '%s' (--list names them)\n", name.c_str());
      return 2;
    }
  }

  // Which library the probes' calls reach: the driver's, or the shim's wrappers (its dlsym
  // answers for the driver when it is preloaded). Opening the driver calls nothing in it.
  std::string reached;
  try {
    const Driver d = open_driver(driver_path);
    Dl_info info{};
    reached = dladdr(reinterpret_cast<void*>(d.cuStreamQuery), &info) != 0 && info.dli_fname != nullptr
                  ? info.dli_fname
                  : "an unknown library";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "driver_model_check: %s\n", e.what());
    return 2;
  }
  const bool shim = reached.find("libgpu_scheduler") != std::string::npos;
  if (through_shim && !shim) {
    std::fprintf(stderr, "driver_model_check: --through-shim, but cuStreamQuery resolves into %s (is "
                 "libgpu_scheduler.so in LD_PRELOAD?)\n", reached.c_str());
    return 2;
  }

  int agreed = 0, recorded = 0;
  std::vector<std::string> disagreeing;
  nlohmann::json answers = {{"about", fmt::format("driver_model_check's answers from {} ({})", driver_path,
                                                  shim ? "through the shim" : "no shim")},
                            {"probes", nlohmann::json::object()}};
  for (const auto& [name, probe] : probes()) {
    if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) continue;
    std::string answer;
    try {
      answer = run_probe(driver_path, probe, timeout_s);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "driver_model_check: %s\n", e.what());
      return 2;
    }
    const std::string want = expected[name]["expect"].get<std::string>();
    const std::string why = expected[name]["why"].get<std::string>();
    nlohmann::json entry = expected[name];
    if (expected[name].value("undefined_behaviour", false) && !judge_undefined) {
      // Handles the driver may have freed: any answer is allowed, none is judged; the fake keeps
      // its own (the shim must never make such a call).
      ++recorded;
      std::printf("recorded  %s: %s (undefined behaviour, not judged; the fake answers: %s)\n", name.c_str(),
                  answer.c_str(), want.c_str());
      if (answer != want) entry["driver_answer"] = answer;
    } else if (answer == want) {
      ++agreed;
      std::printf("agree     %s: %s\n", name.c_str(), answer.c_str());
    } else {
      disagreeing.push_back(name);
      std::printf("DISAGREE  %s: %s\n          the fake's model: %s (%s)\n", name.c_str(), answer.c_str(),
                  want.c_str(), why.c_str());
      if (is_an_answer(answer)) {  // the driver's own answer: the fake had it wrong
        entry = {{"expect", answer},
                 {"why", fmt::format("measured: {} gave this (driver_model_check --answers); the fake had "
                                     "assumed otherwise",
                                     driver_path)},
                 {"fake_answer", want},
                 {"fake_why", why}};
      } else {
        entry["no_answer"] = answer;  // the fake's answer stays: a failure to ask is no model
      }
    }
    answers["probes"][name] = entry;
    // After every probe: a run killed from outside keeps the answers it had.
    if (!answers_path.empty() && !write_json(answers_path, answers)) {
      std::fprintf(stderr, "driver_model_check: cannot write %s\n", answers_path.c_str());
      return 2;
    }
  }
  const std::string list_text = fmt::format("{}", fmt::join(disagreeing, ", "));
  std::printf("driver_model_check: %d of %d probes agree with %s (driver %s, %s; %d more recorded, undefined "
              "behaviour)%s%s\n",
              agreed, agreed + static_cast<int>(disagreeing.size()), expect_path.c_str(), driver_path.c_str(), shim ? "through the shim" : "no shim", recorded,
              disagreeing.empty() ? "" : "; disagree: ", list_text.c_str());
  return disagreeing.empty() ? 0 : 1;
}
