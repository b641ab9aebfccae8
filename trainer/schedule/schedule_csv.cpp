// torch.distributed.pipelining's schedule CSV, both ways (see schedule_csv.h for the format and
// what is kept, dropped and expanded). Cell syntax, from torch 2.11's _Action.from_str:
// [stage][type][micro-batch] with type one of F I B W UNSHARD RESHARD REDUCE_GRAD SEND_F RECV_F
// SEND_B RECV_B, or "(a;b;...)OVERLAP_F_B". Torch matches a prefix of the cell (so "0F3x" reads
// as 0F3 there); here the whole cell must match, and the compute and communication types need a
// micro-batch while UNSHARD / RESHARD / REDUCE_GRAD take none (as torch prints them).
#include "trainer/schedule/schedule_csv.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "trainer/config/config.h"

namespace gpipe {
namespace {

// --- cells ---------------------------------------------------------------------------------

// torch's name of each action type (_ComputationType values).
const char* torch_name(ActionType t) {
  switch (t) {
    case ActionType::kForward: return "F";
    case ActionType::kBackward: return "B";
    case ActionType::kBackwardInput: return "I";
    case ActionType::kBackwardWeight: return "W";
    case ActionType::kSendForward: return "SEND_F";
    case ActionType::kRecvForward: return "RECV_F";
    case ActionType::kSendBackward: return "SEND_B";
    case ActionType::kRecvBackward: return "RECV_B";
  }
  return "?";
}

bool is_send(ActionType t) { return t == ActionType::kSendForward || t == ActionType::kSendBackward; }

bool communicates(const Schedule& s) {
  for (const auto& prog : s.per_rank)
    for (const Action& a : prog)
      if (is_communication(a.type)) return true;
  return false;
}

// One parsed action of a cell: kept (an IR action) or dropped (UNSHARD, RESHARD, REDUCE_GRAD),
// which still places its stage.
struct CellAction {
  int stage = 0;
  std::optional<Action> action;  // empty: dropped
};

constexpr const char* kExpected =
    "expected an empty cell, <stage><type><micro-batch> with type F, B, I, W, SEND_F, RECV_F, SEND_B or RECV_B "
    "(e.g. 2F0, 1SEND_B3), <stage>UNSHARD, <stage>RESHARD, <stage>REDUCE_GRAD, or (<action>;<action>)OVERLAP_F_B "
    "(e.g. (0F3;3B1)OVERLAP_F_B)";

// Where a cell is, for messages: "FILE, row 3 (rank 2), column 5".
struct Where {
  const std::string* source;
  int rank;    // 0-based; the row is rank + 1
  int column;  // 1-based
  std::string text() const {
    return *source + ", row " + std::to_string(rank + 1) + " (rank " + std::to_string(rank) + "), column " +
           std::to_string(column);
  }
};

[[noreturn]] void fail_cell(const Where& at, const std::string& cell, const std::string& why) {
  throw ScheduleCsvError(at.text() + ": cell '" + cell + "' " + why);
}

// Digits at text[pos...]: up to 9 (no overflow), at least one. Advances pos.
std::optional<int> read_number(const std::string& text, size_t& pos) {
  const size_t begin = pos;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])) && pos - begin < 10) ++pos;
  if (pos == begin || pos - begin > 9) return std::nullopt;
  return std::stoi(text.substr(begin, pos - begin));
}

// A single action ("2F0", "1UNSHARD"); `cell` is the whole cell, for messages.
CellAction parse_single(const std::string& text, const Where& at, const std::string& cell) {
  size_t pos = 0;
  const std::optional<int> stage = read_number(text, pos);
  if (!stage) {
    if (pos > 9) fail_cell(at, cell, "has a stage index that is too large");
    fail_cell(at, cell, "is not an action: it does not start with a stage index; " + std::string(kExpected));
  }
  static const std::pair<const char*, std::optional<ActionType>> kTypes[] = {
      // No name is a prefix of another, so the order does not matter.
      {"REDUCE_GRAD", std::nullopt}, {"UNSHARD", std::nullopt}, {"RESHARD", std::nullopt},
      {"SEND_F", ActionType::kSendForward}, {"RECV_F", ActionType::kRecvForward},
      {"SEND_B", ActionType::kSendBackward}, {"RECV_B", ActionType::kRecvBackward},
      {"F", ActionType::kForward}, {"B", ActionType::kBackward}, {"I", ActionType::kBackwardInput},
      {"W", ActionType::kBackwardWeight}};
  for (const auto& [name, type] : kTypes) {
    const std::string n = name;
    if (text.compare(pos, n.size(), n) != 0) continue;
    size_t after = pos + n.size();
    if (!type) {
      if (after != text.size())
        fail_cell(at, cell, "has something after " + n + ": UNSHARD, RESHARD and REDUCE_GRAD take no micro-batch");
      return {*stage, std::nullopt};
    }
    if (after == text.size())
      fail_cell(at, cell, "has no micro-batch index: " + n + " needs one, e.g. " + std::to_string(*stage) + n + "0");
    const std::optional<int> mb = read_number(text, after);
    if (!mb) {
      if (after - (pos + n.size()) > 9) fail_cell(at, cell, "has a micro-batch index that is too large");
      fail_cell(at, cell, "is not an action: '" + text.substr(pos + n.size()) + "' after " + n +
                              " is not a micro-batch index; " + kExpected);
    }
    if (after != text.size())
      fail_cell(at, cell, "is not an action: '" + text.substr(after) + "' follows the micro-batch; " + kExpected);
    return {*stage, Action{*type, *stage, *mb}};
  }
  fail_cell(at, cell, "is not an action: unknown action type '" + text.substr(pos) + "'; " + kExpected);
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// A cell: nothing (a bubble), one action, or OVERLAP_F_B's two sub-actions in order, the first
// marked as starting an overlapped pair.
std::vector<CellAction> parse_cell(const std::string& raw, const Where& at) {
  const std::string cell = trim(raw);
  if (cell.empty()) return {};
  if (cell.find('"') != std::string::npos)
    fail_cell(at, cell, "is quoted: torch's schedule cells never need quotes; " + std::string(kExpected));
  if (cell.front() != '(') return {parse_single(cell, at, cell)};
  const size_t close = cell.find(')');
  if (close == std::string::npos) fail_cell(at, cell, "has no ')': expected (<action>;<action>)OVERLAP_F_B");
  const std::string kind = cell.substr(close + 1);
  if (kind != "OVERLAP_F_B")
    fail_cell(at, cell, "groups sub-actions as '" + kind + "': only (<action>;<action>)OVERLAP_F_B has sub-actions");
  std::vector<CellAction> out;
  std::string inner = cell.substr(1, close - 1);
  if (inner.find('(') != std::string::npos) fail_cell(at, cell, "nests sub-actions: OVERLAP_F_B's are single actions");
  std::stringstream parts(inner);
  for (std::string part; std::getline(parts, part, ';');) {
    part = trim(part);
    if (part.empty()) continue;
    CellAction sub = parse_single(part, at, cell);
    if (!sub.action || is_communication(sub.action->type))
      fail_cell(at, cell, "has sub-action '" + part + "': OVERLAP_F_B's sub-actions are compute actions (F, B, I, W)");
    out.push_back(sub);
  }
  if (out.size() != 2)
    fail_cell(at, cell, "has " + std::to_string(out.size()) +
                            " sub-action(s): an overlapped pair runs two, a forward and a backward, e.g. "
                            "(0F3;3B1)OVERLAP_F_B");
  out.front().action->overlaps_next = true;
  return out;
}

// Rows of the text: split at '\n' (a "\r" before it dropped); a final newline ends the last row
// rather than starting an empty one, as Python's csv.reader reads it.
std::vector<std::string> split_rows(const std::string& text) {
  std::vector<std::string> rows;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string row = text.substr(at, end - at);
    if (!row.empty() && row.back() == '\r') row.pop_back();
    rows.push_back(std::move(row));
    at = end + 1;
  }
  return rows;
}

std::vector<std::string> split_cells(const std::string& row) {
  std::vector<std::string> cells;
  size_t at = 0;
  for (;;) {
    const size_t comma = row.find(',', at);
    cells.push_back(row.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) return cells;
    at = comma + 1;
  }
}

std::string stage_list(const std::set<int>& stages) {
  std::string s;
  for (int st : stages) s += (s.empty() ? "" : ", ") + std::to_string(st);
  return "{" + s + "}";
}

// --- writing -------------------------------------------------------------------------------

// The cell of program[k], "0F3", or "(0F3;3B1)OVERLAP_F_B" for an overlapped pair, in which
// case k moves to the pair's second action.
std::string torch_cell(const std::vector<Action>& program, size_t& k) {
  if (!program[k].overlaps_next || k + 1 >= program.size()) return torch_action_name(program[k]);
  const std::string cell = "(" + torch_action_name(program[k]) + ";" + torch_action_name(program[k + 1]) + ")OVERLAP_F_B";
  ++k;
  return cell;
}

// Each rank's compute actions at the dry-run step they run in (compute-only semantics), as torch
// lays out pipeline_order; std::nullopt if the compute order does not run to the end.
std::optional<std::vector<std::vector<std::string>>> compute_rows_by_step(const Schedule& compute) {
  const ValidationResult result = validate(compute);
  if (!result.ok) return std::nullopt;
  std::vector<std::vector<std::string>> rows(static_cast<size_t>(compute.num_ranks));
  for (int r = 0; r < compute.num_ranks; ++r) {
    const auto& prog = compute.per_rank[static_cast<size_t>(r)];
    for (size_t k = 0; k < prog.size(); ++k) {
      const int step = result.step_of_action[static_cast<size_t>(r)][k];
      if (step < 0) return std::nullopt;
      auto& row = rows[static_cast<size_t>(r)];
      if (row.size() > static_cast<size_t>(step)) return std::nullopt;  // two in one step: not a step grid
      row.resize(static_cast<size_t>(step));
      row.push_back(torch_cell(prog, k));
    }
  }
  return rows;
}

}  // namespace

std::string torch_action_name(const Action& a) {
  return std::to_string(a.stage) + torch_name(a.type) + std::to_string(a.microbatch);
}

std::vector<std::string> torch_cells(const std::vector<Action>& program) {
  std::vector<std::string> cells;
  for (size_t k = 0; k < program.size(); ++k) cells.push_back(torch_cell(program, k));
  return cells;
}

std::string schedule_to_csv(const Schedule& schedule, ScheduleCsvFormat format) {
  std::vector<std::vector<std::string>> rows(static_cast<size_t>(schedule.num_ranks));
  if (format == ScheduleCsvFormat::kComputeOnly) {
    Schedule compute = schedule;
    for (auto& prog : compute.per_rank)
      prog.erase(std::remove_if(prog.begin(), prog.end(), [](const Action& a) { return is_communication(a.type); }),
                 prog.end());
    if (auto by_step = compute_rows_by_step(compute)) {
      rows = std::move(*by_step);
    } else {  // does not run to the end: no step grid, just each rank's order
      for (int r = 0; r < compute.num_ranks && r < static_cast<int>(compute.per_rank.size()); ++r) {
        const auto& prog = compute.per_rank[static_cast<size_t>(r)];
        for (size_t k = 0; k < prog.size(); ++k) rows[static_cast<size_t>(r)].push_back(torch_cell(prog, k));
      }
    }
  } else {
    const Schedule full = communicates(schedule) ? schedule : with_communication(schedule);
    for (int r = 0; r < full.num_ranks && r < static_cast<int>(full.per_rank.size()); ++r) {
      const auto& prog = full.per_rank[static_cast<size_t>(r)];
      auto& row = rows[static_cast<size_t>(r)];
      for (size_t k = 0; k < prog.size();) {
        if (!is_communication(prog[k].type)) {
          row.push_back(torch_cell(prog, k));
          ++k;
          continue;
        }
        size_t end = k;
        while (end < prog.size() && is_communication(prog[end].type)) ++end;
        // One group: its sends, then its receives, each in program order.
        for (size_t i = k; i < end; ++i)
          if (is_send(prog[i].type)) row.push_back(torch_action_name(prog[i]));
        for (size_t i = k; i < end; ++i)
          if (!is_send(prog[i].type)) row.push_back(torch_action_name(prog[i]));
        k = end;
      }
    }
  }
  std::string out;
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) out += (i == 0 ? "" : ",") + row[i];
    out += "\n";
  }
  return out;
}

Schedule schedule_from_csv(const std::string& text, const std::string& source) {
  const std::vector<std::string> rows = split_rows(text);
  if (rows.empty())
    throw ScheduleCsvError(source + ": no rows; expected one row per pipeline rank, cells like 0F0,0B0");

  Schedule s;
  s.kind = ScheduleKind::kFromFile;
  s.num_ranks = static_cast<int>(rows.size());
  s.per_rank.resize(rows.size());
  // Where each program entry came from, to point validation issues at their cells.
  std::vector<std::vector<std::pair<int, std::string>>> origin(rows.size());
  std::map<int, std::pair<int, Where>> first_place;  // stage -> (rank, where first named)
  std::map<int, std::string> first_cell;
  int max_mb = -1;
  std::string max_mb_at;  // where the highest micro-batch index was named
  size_t actions = 0;
  for (int r = 0; r < s.num_ranks; ++r) {
    const std::vector<std::string> cells = split_cells(rows[static_cast<size_t>(r)]);
    for (size_t c = 0; c < cells.size(); ++c) {
      const Where at{&source, r, static_cast<int>(c) + 1};
      for (const CellAction& ca : parse_cell(cells[c], at)) {
        auto [it, fresh] = first_place.try_emplace(ca.stage, r, at);
        if (fresh) first_cell[ca.stage] = trim(cells[c]);
        if (it->second.first != r)
          fail_cell(at, trim(cells[c]),
                    "puts stage " + std::to_string(ca.stage) + " on rank " + std::to_string(r) + ", but " +
                        it->second.second.text() + " ('" + first_cell[ca.stage] + "') already put it on rank " +
                        std::to_string(it->second.first) + ": each stage lives on one rank (its row)");
        if (!ca.action) continue;
        ++actions;
        if (ca.action->microbatch > max_mb) {
          max_mb = ca.action->microbatch;
          max_mb_at = at.text() + " ('" + trim(cells[c]) + "')";
        }
        s.per_rank[static_cast<size_t>(r)].push_back(*ca.action);
        origin[static_cast<size_t>(r)].push_back({at.column, trim(cells[c])});
      }
    }
  }
  if (first_place.empty())
    throw ScheduleCsvError(source + ": names no stage in its " + std::to_string(s.num_ranks) +
                           " row(s); expected cells like 0F0,0B0");
  if (max_mb < 0) throw ScheduleCsvError(source + ": has no compute or communication action (only UNSHARD/RESHARD/REDUCE_GRAD)");
  // Every micro-batch needs at least one action of its own, so an index at or past the number of
  // actions is a typo (0F99999), not a schedule: said here, before the validator sizes its
  // tables by the micro-batch count (a huge index used to exhaust memory).
  if (static_cast<size_t>(max_mb) >= actions)
    throw ScheduleCsvError(max_mb_at + " names micro-batch " + std::to_string(max_mb) + ", but the file has only " +
                           std::to_string(actions) + " action(s), too few for " + std::to_string(max_mb + 1) +
                           " micro-batches: a typo in the index?");

  // Placement: stages 0..S-1 all named, the same number on every rank.
  const int num_stages = first_place.rbegin()->first + 1;
  std::vector<std::set<int>> held(static_cast<size_t>(s.num_ranks));
  for (int stage = 0; stage < num_stages; ++stage) {
    auto it = first_place.find(stage);
    if (it == first_place.end())
      throw ScheduleCsvError(source + ": stage " + std::to_string(stage) + " appears in no row, but stage " +
                             std::to_string(num_stages - 1) + " does; expected stages numbered 0.." +
                             std::to_string(num_stages - 1) + ", each in one row");
    held[static_cast<size_t>(it->second.first)].insert(stage);
    s.stage_to_rank.push_back(it->second.first);
  }
  for (int r = 0; r < s.num_ranks; ++r) {
    if (held[static_cast<size_t>(r)].size() != held[0].size())
      throw ScheduleCsvError(source + ": row " + std::to_string(r + 1) + " (rank " + std::to_string(r) + ") holds stages " +
                             stage_list(held[static_cast<size_t>(r)]) + " but row 1 (rank 0) holds " + stage_list(held[0]) +
                             ": expected the same number of stages on every rank");
  }
  s.stages_per_rank = static_cast<int>(held[0].size());
  s.num_microbatches = max_mb + 1;

  const ValidationResult result = validate(s);
  if (!result.ok) {
    std::string message = source + ": the schedule (" + std::to_string(s.num_ranks) + " ranks, " +
                          std::to_string(num_stages) + " stages, " + std::to_string(s.num_microbatches) +
                          " micro-batches) does not validate:";
    constexpr size_t kIssuesShown = 20;  // a broken file can have thousands: the first ones say it
    for (size_t i = 0; i < result.issues.size() && i < kIssuesShown; ++i) {
      const ValidationIssue& issue = result.issues[i];
      message += "\n  ";
      if (issue.rank >= 0 && issue.step >= 0 && issue.rank < s.num_ranks &&
          issue.step < static_cast<int>(origin[static_cast<size_t>(issue.rank)].size())) {
        const auto& [column, cell] = origin[static_cast<size_t>(issue.rank)][static_cast<size_t>(issue.step)];
        message += Where{&source, issue.rank, column}.text() + " ('" + cell + "'): ";
      }
      message += issue.message;
    }
    if (result.issues.size() > kIssuesShown)
      message += "\n  ... and " + std::to_string(result.issues.size() - kIssuesShown) + " more";
    throw ScheduleCsvError(message + "\n" + render_grid(s, result));
  }
  return s;
}

Schedule load_schedule_csv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ScheduleCsvError(path + ": cannot open the schedule file");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ScheduleCsvError(path + ": cannot read the schedule file");
  return schedule_from_csv(text.str(), path);
}

Schedule schedule_from_file(const ParallelConfig& parallel, const TrainingConfig& training) {
  const std::string& path = parallel.schedule_file;
  Schedule s = load_schedule_csv(path);
  if (s.num_ranks != parallel.model_parallel_size || s.stages_per_rank != parallel.virtual_stages ||
      s.num_microbatches != training.num_microbatches)
    throw ScheduleCsvError(path + ": holds " + std::to_string(s.num_ranks) + " rank(s) x " +
                           std::to_string(s.stages_per_rank) + " stage(s) per rank and " +
                           std::to_string(s.num_microbatches) + " micro-batch(es), but the config has " +
                           "parallel.model_parallel_size " + std::to_string(parallel.model_parallel_size) +
                           ", parallel.virtual_stages " + std::to_string(parallel.virtual_stages) +
                           (parallel.data_parallel_size > 1
                                ? " and training.num_microbatches / parallel.data_parallel_size (one replica's) "
                                : " and training.num_microbatches ") +
                           std::to_string(training.num_microbatches) +
                           "; make them agree (--stages, --virtual-stages, --microbatches)");
  const OverlapMode overlap = parse_overlap_mode(parallel.overlap_f_b);
  if (communicates(s)) {
    // Validated by load_schedule_csv. Without its pairs it still runs: each pair's receives
    // precede it and its sends follow it either way.
    if (overlap == OverlapMode::kOn)
      throw ScheduleCsvError(path + ": parallel.overlap_f_b=true pairs a compute-only schedule, but this file "
                             "already has its sends and receives; write the pairs into it as "
                             "(<forward>;<backward>)OVERLAP_F_B cells, or give it compute-only");
    return with_overlap(s, overlap);
  }
  Schedule lowered;
  try {
    lowered = with_communication(with_overlap(s, overlap));  // torch's lowering of compute_only files
  } catch (const std::invalid_argument& e) {
    throw ScheduleCsvError(path + ": " + e.what());
  }
  const ValidationResult result = validate(lowered);
  if (!result.ok) {
    std::string message = path + ": its compute order is valid, but with the sends and receives torch's lowering "
                          "inserts it does not validate; give the file with communication (compute_comms) to choose "
                          "their order:";
    for (const ValidationIssue& issue : result.issues) message += "\n  " + issue.message;
    throw ScheduleCsvError(message + "\n" + render_grid(lowered, result));
  }
  return lowered;
}

}  // namespace gpipe
