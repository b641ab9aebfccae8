// gpipe_runner: the pipeline-parallel GPT trainer (C++ successor of the seed's gpipe_runner.py).
// All stages run in this process, one thread per pipeline rank (parallel.scheduler
// async_threaded) or all on one thread (naive).
//
// Exit codes: 0 ok (also --help, --print-config, --print-schedule, --validate-only on a valid
// schedule), 2 bad usage or configuration (the message names the flag or field, or the missing
// file), 1 runtime failure.
#include <exception>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>  // PipelineTrainer::train() returns the summary as JSON


#include "trainer/cli.h"
#include "trainer/config.h"
#include "trainer/engine_log.h"
#include "trainer/trainer.h"

namespace {

// Exit codes come from gpipe::exit_code_for (cli.h): 0 ok, 2 what the user can fix, 1 runtime.
int fail(const std::exception& e) {
  const int code = gpipe::report_error(e, std::cout, std::cerr);
  if (code == 2) std::cerr << "gpipe_runner: see --help; --print-config shows the effective configuration\n";
  return code;
}

int run(int argc, char** argv) {
  const gpipe::RunOptions options = gpipe::parse_cli(argc, argv);
  if (auto code = gpipe::run_info_actions(options, std::cout)) {
    return *code == 0 ? 0 : 2;  // a schedule that does not validate is a config problem
  }
  gpipe::PipelineConfig config = options.config;
  gpipe::engine_log_info("config: " + (options.config_path.empty() ? std::string("(built-in defaults)") : options.config_path));
  gpipe::PipelineComponents components = gpipe::create_components(config);
  gpipe::engine_log_info("vocab_size " + std::to_string(config.model.vocab_size) + " (from the tokenizer: " +
                         config.dataset.tokenizer + ")");
  gpipe::PipelineTrainer trainer(config, std::move(components));
  trainer.train();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    return fail(e);
  }
}
