// The daemon's decisions: who holds a grant, in which mode, until when. No I/O and no clock of
// its own (the daemon passes `now`), so every transition is tested under a fake clock.
#include <limits>

#include <fmt/format.h>

#include "gpud/gpud.h"

namespace gpud {

const char* to_string(Role role) {
  switch (role) {
    case Role::kPipeline: return "pipeline";
    case Role::kBestEffort: return "best_effort";
    case Role::kObserver: return "observer";
  }
  return "unknown";
}

std::optional<Role> role_from_string(const std::string& text) {
  if (text == "pipeline") return Role::kPipeline;
  if (text == "best_effort") return Role::kBestEffort;
  if (text == "observer") return Role::kObserver;
  return std::nullopt;
}

int GrantBook::add(Role role, pid_t pid, const std::string& name, int64_t now_ns) {
  if (role == Role::kObserver) throw std::logic_error("an observer holds no grant: the daemon does not book it");
  if (role == Role::kPipeline && pipeline_id_) {
    const Client& p = clients_.at(*pipeline_id_);
    throw ProtocolError(fmt::format("a pipeline is already attached to this GPU (pid {}, '{}'): one per GPU", p.pid,
                                    p.name));
  }
  // Ids are never 0 (the daemon's "not booked") nor one still in use, even after 2^31 clients.
  int id = 0;
  do {
    id = next_id_;
    next_id_ = next_id_ == std::numeric_limits<int>::max() ? 1 : next_id_ + 1;
  } while (clients_.count(id) != 0);
  Client c{role, pid, name, now_ns, {}};
  if (role == Role::kBestEffort) {
    // Gated from the start when a pipeline is there; the first tick settles the mode.
    c.grant = {pipeline_id_ ? GrantMode::kGated : GrantMode::kFree, 1, now_ns + config_.lease_ns,
               config_.inflight_budget_ns};
  }
  clients_.emplace(id, std::move(c));
  if (role == Role::kPipeline) pipeline_id_ = id;
  return id;
}

void GrantBook::remove(int id, const std::string& why) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  recent_departures_.push_back(fmt::format("{} pid {} '{}': {}", to_string(it->second.role), it->second.pid,
                                           it->second.name, why));
  if (recent_departures_.size() > 8) recent_departures_.erase(recent_departures_.begin());
  if (it->second.role == Role::kBestEffort) ++revoked_;
  if (pipeline_id_ == id) pipeline_id_.reset();
  clients_.erase(it);
}

void GrantBook::tick(const WindowView& pipeline, int64_t now_ns) {
  // A heartbeat ahead of now (a pipeline on another clock, CLOCK_REALTIME by mistake, or a forged
  // one) would count as live for ever and gate best-effort work indefinitely: only
  // [now - stale, now + stale] counts.
  const bool pipeline_live = pipeline_id_ && pipeline.heartbeat_ns > 0 &&
                             pipeline.heartbeat_ns >= now_ns - config_.stale_after_ns &&
                             pipeline.heartbeat_ns <= now_ns + config_.stale_after_ns;
  for (auto& [id, c] : clients_) {
    if (c.role != Role::kBestEffort) continue;
    const GrantMode mode = pipeline_live ? GrantMode::kGated : GrantMode::kFree;
    if (mode != c.grant.mode) ++c.grant.epoch;
    c.grant.mode = mode;
    c.grant.inflight_budget_ns = config_.inflight_budget_ns;
    c.grant.lease_expiry_ns = now_ns + config_.lease_ns;
  }
}

GrantView GrantBook::grant(int id) const {
  auto it = clients_.find(id);
  if (it == clients_.end()) return GrantView{};  // revoked
  return it->second.grant;
}

nlohmann::json GrantBook::status(const WindowView& pipeline, int64_t now_ns) const {
  nlohmann::json clients = nlohmann::json::array();
  for (const auto& [id, c] : clients_) {
    nlohmann::json j = {{"id", id}, {"role", to_string(c.role)}, {"pid", c.pid}, {"name", c.name},
                        {"attached_s", static_cast<double>(now_ns - c.since_ns) / 1e9}};
    if (c.role == Role::kBestEffort) {
      j["mode"] = c.grant.mode == GrantMode::kGated ? "gated" : c.grant.mode == GrantMode::kFree ? "free" : "revoked";
      j["lease_left_ms"] = static_cast<double>(c.grant.lease_expiry_ns - now_ns) / 1e6;
      j["inflight_budget_us"] = static_cast<double>(c.grant.inflight_budget_ns) / 1e3;
    }
    clients.push_back(std::move(j));
  }
  nlohmann::json p = nullptr;
  if (pipeline_id_) {
    p = {{"windows_published", pipeline.windows_published},
         // In double: the page's values are the pipeline's to write, any int64 (no signed overflow).
         {"heartbeat_age_ms", pipeline.heartbeat_ns ? (static_cast<double>(now_ns) - static_cast<double>(pipeline.heartbeat_ns)) / 1e6 : -1.0},
         {"window_ms", {(static_cast<double>(pipeline.open_ns) - static_cast<double>(now_ns)) / 1e6,
                        (static_cast<double>(pipeline.close_ns) - static_cast<double>(now_ns)) / 1e6}}};
  }
  return {{"clients", clients}, {"pipeline", p}, {"grants_revoked", revoked_}, {"recent_departures", recent_departures_}};
}

}  // namespace gpud
