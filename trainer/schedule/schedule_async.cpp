// Asynchronous pipelines as data (parallel.sync_mode: asp, PipeDream's 1F1B-async / VPipe's asp):
// each stage updates its weights after every backward, so micro-batches in flight run with
// different weight versions. with_weight_versions() annotates each F and B with the version it
// runs with, stashed_versions() counts what weight stashing costs, and check_weight_versions()
// (called by validate()) catches a schedule whose versions do not follow the rule.
#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

#include "schedule_internal.h"

namespace gpipe {

SyncMode parse_sync_mode(const std::string& name) {
  if (name == "bsp") return SyncMode::kBsp;
  if (name == "asp") return SyncMode::kAsp;
  throw std::invalid_argument("unknown sync mode '" + name + "' (choose bsp or asp)");
}

const char* to_string(SyncMode mode) { return mode == SyncMode::kAsp ? "asp" : "bsp"; }

namespace {

// Walks each rank's program in order, calling `f(rank, index, action, expected_version)` for every
// F and B with the version the rule gives it: F the stage's updates so far, B its F's version
// (stashing) or the stage's updates so far; each B is one update of its stage. Ranks are
// independent (a stage lives on one rank), so program order alone decides the versions.
template <typename F>
void walk_versions(const Schedule& s, bool stashing, F&& f) {
  for (int r = 0; r < static_cast<int>(s.per_rank.size()); ++r) {
    std::map<int, int> updates;                         // stage -> updates so far
    std::map<std::pair<int, int>, int> forward_version;  // (stage, mb) -> its F's version
    const auto& prog = s.per_rank[static_cast<size_t>(r)];
    for (size_t k = 0; k < prog.size(); ++k) {
      const Action& a = prog[k];
      if (a.type == ActionType::kForward) {
        const int v = updates[a.stage];
        forward_version[{a.stage, a.microbatch}] = v;
        f(r, k, a, v);
      } else if (a.type == ActionType::kBackward) {
        auto fv = forward_version.find({a.stage, a.microbatch});
        const int v = stashing && fv != forward_version.end() ? fv->second : updates[a.stage];
        f(r, k, a, v);
        ++updates[a.stage];
      }
    }
  }
}

}  // namespace

Schedule with_weight_versions(const Schedule& compute_only, bool stashing) {
  for (const auto& prog : compute_only.per_rank) {
    for (const Action& a : prog) {
      if (a.type == ActionType::kBackwardInput || a.type == ActionType::kBackwardWeight) {
        throw std::invalid_argument(std::string("sync_mode asp: ") + to_string(compute_only.kind) +
                                    " splits the backward (I/W), but an asynchronous update needs a stage's whole "
                                    "gradient after each backward; use parallel.schedule: 1f1b (PipeDream's 1F1B-async)");
      }
      if (a.overlaps_next) {
        throw std::invalid_argument("sync_mode asp: overlapped forward+backward pairs would run two weight versions "
                                    "at once on one stage; set parallel.overlap_f_b: false");
      }
    }
  }
  Schedule out = compute_only;
  out.sync_mode = SyncMode::kAsp;
  out.weight_stashing = stashing;
  walk_versions(out, stashing, [&](int r, size_t k, const Action&, int v) {
    out.per_rank[static_cast<size_t>(r)][k].weight_version = v;
  });
  return out;
}

std::vector<int> stashed_versions(const Schedule& s) {
  std::vector<int> most(static_cast<size_t>(s.num_stages()), 0);
  if (s.sync_mode != SyncMode::kAsp || !s.weight_stashing) return most;
  for (const auto& prog : s.per_rank) {
    // Per stage: the versions in-flight micro-batches still need (version -> how many), and the
    // newest version.
    std::map<int, std::map<int, int>> needed;
    std::map<int, int> newest;
    std::map<std::pair<int, int>, int> forward_version;
    for (const Action& a : prog) {
      if (a.stage < 0 || a.stage >= s.num_stages()) continue;
      if (a.type == ActionType::kForward) {
        forward_version[{a.stage, a.microbatch}] = a.weight_version;
        ++needed[a.stage][a.weight_version];
      } else if (a.type == ActionType::kBackward) {
        auto fv = forward_version.find({a.stage, a.microbatch});
        if (fv == forward_version.end()) continue;
        auto& held = needed[a.stage];
        if (--held[fv->second] == 0) held.erase(fv->second);
        ++newest[a.stage];  // one update per backward
      } else {
        continue;
      }
      // Versions held besides the newest, right after this action.
      int stashed = 0;
      for (const auto& [version, n] : needed[a.stage]) stashed += version != newest[a.stage];
      int& m = most[static_cast<size_t>(a.stage)];
      m = std::max(m, stashed);
    }
  }
  return most;
}

std::vector<ValidationIssue> detail::check_weight_versions(const Schedule& s) {
  std::vector<ValidationIssue> issues;
  if (s.sync_mode != SyncMode::kAsp) {
    for (int r = 0; r < static_cast<int>(s.per_rank.size()); ++r) {
      const auto& prog = s.per_rank[static_cast<size_t>(r)];
      for (size_t k = 0; k < prog.size(); ++k) {
        if (prog[k].weight_version >= 0) {
          issues.push_back({r, static_cast<int>(k),
                            "rank " + std::to_string(r) + ": " + to_string(prog[k]) +
                                " carries a weight version but the schedule is bsp (one update per step)"});
          return issues;
        }
      }
    }
    return issues;
  }
  walk_versions(s, s.weight_stashing, [&](int r, size_t k, const Action& a, int v) {
    if (a.weight_version == v || issues.size() >= 4) return;
    issues.push_back({r, static_cast<int>(k),
                      "rank " + std::to_string(r) + ": " + to_string(a) + " runs with weight version " +
                          std::to_string(a.weight_version) + ", expected " + std::to_string(v) +
                          (a.type == ActionType::kForward
                               ? " (its stage's updates so far)"
                               : s.weight_stashing ? " (its forward's version: weight stashing)"
                                                   : " (the newest version: no stashing)")});
  });
  for (int r = 0; r < static_cast<int>(s.per_rank.size()); ++r) {
    const auto& prog = s.per_rank[static_cast<size_t>(r)];
    for (size_t k = 0; k < prog.size(); ++k) {
      const ActionType t = prog[k].type;
      if (t == ActionType::kBackwardInput || t == ActionType::kBackwardWeight || prog[k].overlaps_next) {
        issues.push_back({r, static_cast<int>(k),
                          "rank " + std::to_string(r) + ": " + to_string(prog[k]) +
                              " in an asynchronous schedule (asp needs whole backwards and no overlapped pairs)"});
        return issues;
      }
    }
  }
  return issues;
}

}  // namespace gpipe
