// Step x rank grid of a validated schedule: row = dry-run step, column = rank, cell = what the
// rank finished in that step (a communication group shows as "SF3+RB1", an overlapped pair as
// "(F3;B1)"). Actions named by an
// issue are marked "!B1!" and their row ends with " <"; actions that never ran (a deadlock) are
// shown in a last "stuck" row. The issue messages follow the grid.
#include <algorithm>
#include <set>
#include <sstream>

#include "trainer/schedule/schedule.h"

namespace gpipe {
namespace {

// With one stage per rank, stage r on rank r, the column already says the stage.
bool column_is_stage(const Schedule& s) {
  if (s.stages_per_rank != 1) return false;
  for (int stage = 0; stage < s.num_stages(); ++stage)
    if (s.rank_of_stage(stage) != stage) return false;
  return true;
}

std::string cell_label(bool short_labels, const Action& a) {
  // "F3", not "2F3"; "F3@v1" with the weight version of an asynchronous schedule.
  std::string label = short_labels ? std::string(short_name(a.type)) + std::to_string(a.microbatch) : to_string(a);
  if (a.weight_version >= 0) label += "@v" + std::to_string(a.weight_version);
  return label;
}

}  // namespace

std::string render_grid(const Schedule& schedule, const ValidationResult& result) {
  const int P = schedule.num_ranks;
  const bool short_labels = column_is_stage(schedule);
  std::set<std::pair<int, int>> marked;
  for (const ValidationIssue& i : result.issues)
    if (i.rank >= 0 && i.step >= 0) marked.insert({i.rank, i.step});

  auto ran_at = [&](int r, int k) {
    if (r < static_cast<int>(result.step_of_action.size()) && k < static_cast<int>(result.step_of_action[r].size()))
      return result.step_of_action[r][k];
    return -1;
  };
  // rows[step][rank] = cell text; the extra last row collects actions that never ran but are marked.
  const int rows_n = result.num_steps + 1;
  std::vector<std::vector<std::string>> rows(rows_n + 1, std::vector<std::string>(P));
  std::vector<bool> row_marked(rows_n + 1, false);
  bool any_stuck = false;
  for (int r = 0; r < P && r < static_cast<int>(schedule.per_rank.size()); ++r) {
    for (int k = 0; k < static_cast<int>(schedule.per_rank[r].size()); ++k) {
      const int step = ran_at(r, k);
      const bool mark = marked.count({r, k}) > 0;
      if (step < 0 && !mark) continue;
      const int row = (step >= 0 && step < rows_n) ? step : rows_n;
      if (row == rows_n) any_stuck = true;
      const auto& prog = schedule.per_rank[r];
      std::string label = cell_label(short_labels, prog[k]);
      if (mark) label = "!" + label + "!";
      // An overlapped pair that ran in one step is one cell, "(F3;B1)".
      if (prog[k].overlaps_next && k + 1 < static_cast<int>(prog.size()) && ran_at(r, k + 1) == step && step >= 0) {
        std::string second = cell_label(short_labels, prog[k + 1]);
        if (marked.count({r, k + 1}) > 0) {
          second = "!" + second + "!";
          row_marked[row] = true;
        }
        label = "(" + label + ";" + second + ")";
        ++k;
      }
      row_marked[row] = row_marked[row] || mark;
      std::string& cell = rows[row][r];
      cell += (cell.empty() ? "" : "+") + label;
    }
  }

  std::vector<size_t> width(P);
  for (int r = 0; r < P; ++r) {
    width[r] = ("rank " + std::to_string(r)).size();
    for (const auto& row : rows) width[r] = std::max(width[r], row[r].size());
  }
  auto pad = [](std::string s, size_t w) {
    s.resize(std::max(w, s.size()), ' ');
    return s;
  };
  std::ostringstream out;
  auto emit_line = [&out](std::string line) {  // no trailing blanks from padding the last column
    line.erase(line.find_last_not_of(' ') + 1);
    out << line << "\n";
  };
  const size_t label_w = std::max<size_t>(5, std::to_string(rows_n).size());
  std::string header = pad("step", label_w);
  for (int r = 0; r < P; ++r) header += " | " + pad("rank " + std::to_string(r), width[r]);
  emit_line(header);
  for (int row = 0; row <= rows_n; ++row) {
    const bool stuck_row = row == rows_n;
    if (stuck_row && !any_stuck) break;
    bool empty = true;
    for (int r = 0; r < P; ++r) empty = empty && rows[row][r].empty();
    if (empty && !stuck_row) continue;  // nobody finished anything (all waiting): skip the row
    const std::string label = stuck_row ? "stuck" : std::to_string(row);
    std::string line = std::string(label_w - label.size(), ' ') + label;
    for (int r = 0; r < P; ++r) line += " | " + pad(rows[row][r], width[r]);
    if (row_marked[row]) line += " <";
    emit_line(line);
  }
  if (!result.issues.empty()) {
    out << result.issues.size() << " issue(s):\n";
    for (const ValidationIssue& i : result.issues) out << "  " << i.message << "\n";
  } else {
    out << "ok: " << result.num_steps << " steps, no deadlock, every forward and backward exactly once\n";
  }
  return out.str();
}

}  // namespace gpipe
