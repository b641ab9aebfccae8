// Test helper for tests/trainer/torch_schedule_csv_test.py: our schedule CSV writer and reader
// as a command line, so the Python side can hand files to and take files from torch.
//   schedule_csv_tool write KIND RANKS MICROBATCHES STAGES_PER_RANK compute_only|compute_comms [OVERLAP]
//       prints the generated schedule (make_schedule, with_overlap(OVERLAP: auto, true, false;
//       default auto), with_communication) as CSV
//   schedule_csv_tool read FILE
//       reads and validates FILE; prints "ranks R stages_per_rank V microbatches M", then
//       "placement s0 s1 ..." (the rank of each stage), then one line per rank with its program
//       as space-separated torch cells ("0F0 0SEND_F0 (0F3;3B1)OVERLAP_F_B ..."). Exit 1 with the error.
//   schedule_csv_tool lower FILE
//       as read, for what the runner would execute (schedule_from_file's lowering of a
//       compute-only file), printed as compute_comms CSV.
#include <cstdlib>
#include <iostream>
#include <string>

#include "trainer/config/config.h"
#include "trainer/schedule/schedule.h"
#include "trainer/schedule/schedule_csv.h"

namespace {

int usage() {
  std::cerr << "usage: schedule_csv_tool write KIND RANKS MICROBATCHES STAGES_PER_RANK compute_only|compute_comms "
               "[auto|true|false]\n"
               "       schedule_csv_tool read FILE\n"
               "       schedule_csv_tool lower FILE\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gpipe;
  const std::string command = argc > 1 ? argv[1] : "";
  try {
    if (command == "write" && (argc == 7 || argc == 8)) {
      const std::string format = argv[6];
      if (format != "compute_only" && format != "compute_comms") return usage();
      const Schedule compute =
          with_overlap(make_schedule(parse_schedule_kind(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5])),
                       parse_overlap_mode(argc == 8 ? argv[7] : "auto"));
      std::cout << schedule_to_csv(format == "compute_only" ? compute : with_communication(compute),
                                   format == "compute_only" ? ScheduleCsvFormat::kComputeOnly
                                                            : ScheduleCsvFormat::kComputeComms);
      return 0;
    }
    if (command == "read" && argc == 3) {
      const Schedule s = load_schedule_csv(argv[2]);
      std::cout << "ranks " << s.num_ranks << " stages_per_rank " << s.stages_per_rank << " microbatches "
                << s.num_microbatches << "\nplacement";
      for (int stage = 0; stage < s.num_stages(); ++stage) std::cout << " " << s.rank_of_stage(stage);
      std::cout << "\n";
      for (const auto& prog : s.per_rank) {
        const std::vector<std::string> cells = torch_cells(prog);
        for (size_t k = 0; k < cells.size(); ++k) std::cout << (k == 0 ? "" : " ") << cells[k];
        std::cout << "\n";
      }
      return 0;
    }
    if (command == "lower" && argc == 3) {
      Schedule s = load_schedule_csv(argv[2]);
      ParallelConfig parallel;
      TrainingConfig training;
      parallel.schedule_file = argv[2];
      parallel.model_parallel_size = s.num_ranks;
      parallel.virtual_stages = s.stages_per_rank;
      training.num_microbatches = s.num_microbatches;
      std::cout << schedule_to_csv(schedule_from_file(parallel, training), ScheduleCsvFormat::kComputeComms);
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "schedule_csv_tool: " << e.what() << "\n";
    return 1;
  }
  return usage();
}
