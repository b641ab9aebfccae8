// launch_workers() over /bin/sh workers: the env:// variables they get, exit-code propagation,
// teardown of the survivors after a failure, signal forwarding; strip_launcher_flags() cases.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "temp_dir.h"
#include "trainer/launch/launcher.h"
#include "trainer/launch/world.h"

namespace gpipe {
namespace {

using namespace std::chrono_literals;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using Args = std::vector<std::string>;

Args shell(const std::string& script) { return {"/bin/sh", "-c", script}; }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

bool wait_for_file(const std::string& path, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!exists(path)) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

LaunchOptions options(int nproc, std::chrono::milliseconds grace = 30000ms) {
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.grace = grace;
  return o;
}

// A worker that waits (interruptibly: `sleep & wait`, so its trap runs at once) until SIGTERM.
// The trap kills its own sleep so nothing outlives the test.
std::string sleeper(const std::string& dir, const std::string& on_term) {
  return "trap 'kill $! 2>/dev/null; " + on_term + "' TERM; echo $$ > " + dir + "/pid.$LOCAL_RANK; sleep 100 & wait $!";
}

TEST(Launcher, WorkersGetTheRendezvousVariables) {
  testing::TempDir dir;
  ::setenv("GPIPE_TEST_INHERITED", "kept", 1);
  ::setenv("RANK", "99", 1);  // a stale value from the launcher's own environment must not leak through
  ::setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  LaunchOptions o = options(3);
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "10.1.2.3";
  o.master_port = 29555;
  const int code = launch_workers(
      o, shell("echo $RANK $WORLD_SIZE $LOCAL_RANK $MASTER_PORT $MASTER_ADDR $GROUP_RANK $LOCAL_WORLD_SIZE "
               "$GPIPE_TEST_INHERITED ${TORCHELASTIC_USE_AGENT_STORE:-none} > " +
               dir.path() + "/out.$LOCAL_RANK"));
  ::unsetenv("GPIPE_TEST_INHERITED");
  ::unsetenv("RANK");
  ::unsetenv("TORCHELASTIC_USE_AGENT_STORE");
  EXPECT_EQ(code, 0);
  EXPECT_EQ(read_file(dir.path() + "/out.0"), "3 6 0 29555 10.1.2.3 1 3 kept none\n");
  EXPECT_EQ(read_file(dir.path() + "/out.1"), "4 6 1 29555 10.1.2.3 1 3 kept none\n");
  EXPECT_EQ(read_file(dir.path() + "/out.2"), "5 6 2 29555 10.1.2.3 1 3 kept none\n");
}

TEST(Launcher, AllCleanExitsReturnZero) { EXPECT_EQ(launch_workers(options(4), shell("exit 0")), 0); }

TEST(Launcher, WorkersStartWithNoSignalBlocked) {
  // The runner may block signals in the launching thread; the workers must not inherit that.
  testing::TempDir dir;
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGUSR1);
  ::pthread_sigmask(SIG_BLOCK, &block, &old);
  const int code = launch_workers(options(1), shell("exec grep SigBlk /proc/self/status > " + dir.path() + "/mask"));
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  EXPECT_EQ(code, 0);
  EXPECT_THAT(read_file(dir.path() + "/mask"), HasSubstr("0000000000000000"));
}

TEST(Launcher, AFailureEndsTheOthersAfterTheGraceAndReturnsItsCode) {
  testing::TempDir dir;
  const std::string d = dir.path();
  // Rank 0 fails once rank 1 is up and trapping; rank 1 would sleep 100 s.
  const std::string script = "if [ $LOCAL_RANK = 1 ]; then " + sleeper(d, "echo term > " + d + "/trapped; exit 143") +
                             "; else while [ ! -e " + d + "/pid.1 ]; do sleep 0.01; done; exit 3; fi";
  const auto start = Clock::now();
  const int code = launch_workers(options(2, 300ms), shell(script));
  const auto elapsed = Clock::now() - start;
  EXPECT_EQ(code, 3);
  EXPECT_GE(elapsed, 300ms);  // the survivor had its grace period first
  EXPECT_LT(elapsed, 4s);
  EXPECT_EQ(read_file(d + "/trapped"), "term\n");
  const pid_t sleeper_pid = std::stoi(read_file(d + "/pid.1"));
  EXPECT_EQ(::kill(sleeper_pid, 0), -1);  // reaped: nothing left behind
}

TEST(Launcher, AWorkerKilledBySignalGives128PlusTheSignal) {
  EXPECT_EQ(launch_workers(options(1), shell("kill -KILL $$")), 137);
  EXPECT_EQ(launch_workers(options(2, 0ms), shell("if [ $LOCAL_RANK = 1 ]; then kill -SEGV $$; fi; exit 0")), 139);
}

TEST(Launcher, AWorkerIgnoringSigtermIsKilled) {
  // 5 s: the fixed SIGTERM -> SIGKILL delay. The stubborn worker ignores SIGTERM in a loop of short sleeps.
  testing::TempDir dir;
  const std::string d = dir.path();
  const std::string script = "if [ $LOCAL_RANK = 1 ]; then trap '' TERM; echo $$ > " + d +
                             "/pid; while :; do sleep 0.05; done; else while [ ! -e " + d +
                             "/pid ]; do sleep 0.01; done; exit 5; fi";
  const auto start = Clock::now();
  EXPECT_EQ(launch_workers(options(2, 0ms), shell(script)), 5);
  EXPECT_GE(Clock::now() - start, 5s);
  EXPECT_EQ(::kill(std::stoi(read_file(d + "/pid")), 0), -1);
}

TEST(Launcher, SigtermToTheLauncherReachesEveryWorker) {
  testing::TempDir dir;
  const std::string d = dir.path();
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    // As in the runner, another thread is alive; with SIGTERM blocked in the launching thread the
    // kernel must deliver it to that thread, and the launcher still has to see it.
    std::atomic<bool> done{false};
    std::thread bystander([&done] {
      while (!done) std::this_thread::sleep_for(1ms);
    });
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    ::pthread_sigmask(SIG_BLOCK, &term, nullptr);
    int code = 99;
    try {
      code = launch_workers(options(2), shell(sleeper(d, "echo got > " + d + "/term.$LOCAL_RANK; exit 7")));
    } catch (...) {
    }
    done = true;
    bystander.join();
    ::_exit(code);
  }
  const bool ready = wait_for_file(d + "/pid.0", 5s) && wait_for_file(d + "/pid.1", 5s);
  // The pid files are written just before `wait`; give the shells a moment to reach it.
  std::this_thread::sleep_for(50ms);
  ::kill(launcher, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(launcher, &status, 0), launcher);
  ASSERT_TRUE(ready);
  ASSERT_TRUE(WIFEXITED(status)) << "launcher died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 7);
  EXPECT_EQ(read_file(d + "/term.0"), "got\n");
  EXPECT_EQ(read_file(d + "/term.1"), "got\n");
}

TEST(Launcher, BadOptionsAreWorldErrors) {
  const Args ok = shell("exit 0");
  LaunchOptions o = options(0);
  EXPECT_THROW(launch_workers(o, ok), WorldError);
  o = options(1);
  o.nnodes = 2;
  o.node_rank = 2;
  EXPECT_THROW(launch_workers(o, ok), WorldError);
  o = options(1);
  o.node_rank = -1;
  EXPECT_THROW(launch_workers(o, ok), WorldError);
  o = options(1);
  o.master_port = 70000;
  EXPECT_THROW(launch_workers(o, ok), WorldError);
  EXPECT_THROW(launch_workers(options(1), {}), WorldError);
  try {
    launch_workers(options(2), {"/nonexistent/gpipe_runner"});
    ADD_FAILURE() << "no WorldError";
  } catch (const WorldError& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/gpipe_runner"));
  }
}

TEST(Launcher, UnderAnSrunStepOfSeveralTasksEachTaskMustBeANode) {
  using Env = std::map<std::string, std::string>;
  auto check = [](const LaunchOptions& o, const Env& env) {
    check_launch_under_slurm(o, [&env](const char* n) -> const char* {
      auto it = env.find(n);
      return it == env.end() ? nullptr : it->second.c_str();
    });
  };
  LaunchOptions o = options(4);
  EXPECT_NO_THROW(check(o, {}));                                                   // no SLURM
  EXPECT_NO_THROW(check(o, {{"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_PROCID", "0"}}));  // one task: a node of its own
  // srun -n2 gpipe_runner --nproc-per-node 4: two 4-rank jobs on one port and output folder.
  try {
    check(o, {{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "1"}});
    ADD_FAILURE() << "no WorldError";
  } catch (const WorldError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("srun step of 2 tasks (this is task 1)"), HasSubstr("--nnodes 1"),
                                HasSubstr("without --nproc-per-node")));
  }
  // One task per node, each told its node: fine; the same --node-rank on every task is not.
  o.nnodes = 2;
  o.node_rank = 1;
  EXPECT_NO_THROW(check(o, {{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "1"}}));
  EXPECT_THROW(check(o, {{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "0"}}), WorldError);
  // Two tasks calling themselves nodes while the step has one node: they would share its GPUs.
  EXPECT_THROW(check(o, {{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_NUM_NODES", "1"}, {"SLURM_PROCID", "1"}}),
               WorldError);
  EXPECT_NO_THROW(check(o, {{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_PROCID", "1"}}));
  // Garbage was read as 0 (atoi) and the check skipped.
  o.nnodes = 1;
  o.node_rank = 0;
  try {
    check(o, {{"SLURM_STEP_NUM_TASKS", "2x"}, {"SLURM_PROCID", "1"}});
    ADD_FAILURE() << "no WorldError";
  } catch (const WorldError& e) {
    EXPECT_THAT(e.what(), HasSubstr("SLURM_STEP_NUM_TASKS='2x'"));
  }
  EXPECT_THROW(check(o, {{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "one"}}), WorldError);
}

TEST(Launcher, StripRemovesOnlyTheLauncherFlags) {
  EXPECT_THAT(strip_launcher_flags({"gpipe_runner", "--nproc-per-node", "4", "--config", "c.yaml"}),
              ElementsAre("gpipe_runner", "--config", "c.yaml"));
  EXPECT_THAT(strip_launcher_flags({"r", "--nproc-per-node=4", "--nnodes=2", "--node-rank", "1", "--master-addr", "h",
                                    "--master-port=1234", "--steps", "3"}),
              ElementsAre("r", "--steps", "3"));
  EXPECT_THAT(strip_launcher_flags({"r", "--nnodes", "2", "--master-port", "1", "--master-addr=x", "--node-rank=0"}),
              ElementsAre("r"));
  // Look-alikes and values stay; so does everything after "--".
  EXPECT_THAT(strip_launcher_flags({"r", "--nproc-per-node-x", "--nnodesx=1", "--set", "nnodes=2"}),
              ElementsAre("r", "--nproc-per-node-x", "--nnodesx=1", "--set", "nnodes=2"));
  EXPECT_THAT(strip_launcher_flags({"r", "--nnodes", "2", "--", "--nnodes", "3"}),
              ElementsAre("r", "--", "--nnodes", "3"));
  EXPECT_THAT(strip_launcher_flags({"r", "--nproc-per-node"}), ElementsAre("r"));
}

TEST(Launcher, SelfExecutablePathIsThisTestBinary) {
  const std::string path = self_executable_path();
  EXPECT_EQ(path.front(), '/');
  EXPECT_THAT(path, HasSubstr("trainer_core_tests"));
  EXPECT_TRUE(exists(path));
}

}  // namespace
}  // namespace gpipe
