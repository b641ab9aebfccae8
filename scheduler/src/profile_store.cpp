// ProfileStore: per-kernel entries behind one shared_mutex. The hot path (estimate) takes the
// lock shared; entries are created, named and given new launch shapes under the exclusive lock,
// which happens once per kernel or shape. Learned values are atomics so that completions also
// need only the shared lock.
#include "scheduler/profile_store.h"

#include <atomic>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "profile_csv.h"

namespace sched {

namespace {

struct ShapeSms {
  Dim3 block;
  uint32_t shared_mem_bytes = 0;
  int blocks_per_sm = 0;
};

struct Entry {
  KernelId id = 0;
  std::string name;  // written once under the exclusive lock
  std::atomic<int8_t> profile{static_cast<int8_t>(KernelProfile::kUnknown)};
  std::atomic<double> duration_ns{0};
  std::atomic<uint64_t> samples{0};
  uint64_t memory_footprint = 0;  // exclusive lock
  int imported_sm_usage = 0;      // exclusive lock
  std::vector<ShapeSms> shapes;   // exclusive lock to add, shared to read
};

bool same_shape(const ShapeSms& s, const KernelInfo& k) {
  return s.block.x == k.block.x && s.block.y == k.block.y && s.block.z == k.block.z &&
         s.shared_mem_bytes == k.shared_mem_bytes;
}

}  // namespace

struct ProfileStore::Impl {
  double alpha;
  mutable std::shared_mutex mu;
  std::unordered_map<KernelId, std::unique_ptr<Entry>> by_id;
  // Entries whose handle now names another kernel (a module was unloaded and the address
  // reused): kept, so the name pointers handed out for them stay valid.
  std::vector<std::unique_ptr<Entry>> retired;
  std::unordered_map<std::string, detail::ProfileRow> imported;  // by kernel name

  // Exclusive lock held.
  Entry& get_or_create(KernelId id) {
    auto& slot = by_id[id];
    if (!slot) {
      slot = std::make_unique<Entry>();
      slot->id = id;
    }
    return *slot;
  }
  // Exclusive lock held.
  void name_entry(Entry& e, std::string_view name) {
    if (!e.name.empty() || name.empty()) return;
    e.name = std::string(name);
    auto it = imported.find(e.name);
    if (it != imported.end()) apply(e, it->second);
  }
  static void apply(Entry& e, const detail::ProfileRow& row) {
    e.profile.store(static_cast<int8_t>(row.profile), std::memory_order_relaxed);
    if (e.samples.load(std::memory_order_relaxed) == 0) {
      e.duration_ns.store(row.duration_ns, std::memory_order_relaxed);
    }
    e.memory_footprint = row.memory_footprint;
    e.imported_sm_usage = row.sm_usage;
  }
};

ProfileStore::ProfileStore(double ewma_alpha) : impl_(std::make_unique<Impl>()) {
  if (!(ewma_alpha > 0 && ewma_alpha <= 1)) {
    throw std::invalid_argument("ProfileStore: ewma_alpha must be in (0, 1], got " +
                                std::to_string(ewma_alpha));
  }
  impl_->alpha = ewma_alpha;
}

ProfileStore::~ProfileStore() = default;

const char* ProfileStore::register_kernel(KernelId id, std::string_view name) {
  {
    std::shared_lock lock(impl_->mu);
    auto it = impl_->by_id.find(id);
    if (it != impl_->by_id.end() && (name.empty() || it->second->name == name)) {
      return it->second->name.empty() ? nullptr : it->second->name.c_str();
    }
  }
  std::unique_lock lock(impl_->mu);
  auto it = impl_->by_id.find(id);
  if (it != impl_->by_id.end() && !it->second->name.empty() && it->second->name != name) {
    // The handle now names another kernel: what was learned (duration, profile, SMs per launch
    // shape) belongs to the old one.
    impl_->retired.push_back(std::move(it->second));
    impl_->by_id.erase(it);
  }
  Entry& e = impl_->get_or_create(id);
  impl_->name_entry(e, name);
  return e.name.empty() ? nullptr : e.name.c_str();
}

OpEstimate ProfileStore::estimate(const KernelInfo& kernel, Device& device) {
  OpEstimate est;
  {
    std::shared_lock lock(impl_->mu);
    auto it = impl_->by_id.find(kernel.id);
    if (it != impl_->by_id.end()) {
      const Entry& e = *it->second;
      // Review fix: an empty (non-null) name can never be stored (name_entry ignores it), so it
      // must not count as "needs a name": it sent every launch of such a kernel down the
      // exclusive-lock path with a fresh occupancy query.
      const bool needs_name = e.name.empty() && kernel.name != nullptr && kernel.name[0] != '\0';
      for (const ShapeSms& s : e.shapes) {
        if (!needs_name && same_shape(s, kernel)) {
          est.duration_ns = e.duration_ns.load(std::memory_order_relaxed);
          est.profile = static_cast<KernelProfile>(e.profile.load(std::memory_order_relaxed));
          if (kernel.profile_hint != KernelProfile::kUnknown) est.profile = kernel.profile_hint;
          est.sms_needed = sms_needed(kernel, device.sm_count(), s.blocks_per_sm);
          return est;
        }
      }
    }
  }
  // First sight of this kernel or launch shape: ask the device outside any lock. An answer the
  // device cannot give now (the helper thread has no context) counts as one block per SM for
  // this estimate only: the shape is asked again next time, from a thread that may have one.
  const int answer = device.max_active_blocks_per_sm(kernel);
  const int blocks_per_sm = answer == Device::kOccupancyUnknown ? 1 : answer;
  std::unique_lock lock(impl_->mu);
  Entry& e = impl_->get_or_create(kernel.id);
  if (kernel.name != nullptr) impl_->name_entry(e, kernel.name);
  bool cached = false;
  for (const ShapeSms& s : e.shapes) cached = cached || same_shape(s, kernel);
  if (!cached && answer != Device::kOccupancyUnknown) {
    e.shapes.push_back({kernel.block, kernel.shared_mem_bytes, blocks_per_sm});
  }
  est.duration_ns = e.duration_ns.load(std::memory_order_relaxed);
  est.profile = static_cast<KernelProfile>(e.profile.load(std::memory_order_relaxed));
  if (kernel.profile_hint != KernelProfile::kUnknown) est.profile = kernel.profile_hint;
  est.sms_needed = sms_needed(kernel, device.sm_count(), blocks_per_sm);
  return est;
}

KernelProfile ProfileStore::profile_of(KernelId id) const {
  std::shared_lock lock(impl_->mu);
  auto it = impl_->by_id.find(id);
  if (it == impl_->by_id.end()) return KernelProfile::kUnknown;
  return static_cast<KernelProfile>(it->second->profile.load(std::memory_order_relaxed));
}

void ProfileStore::record_completion(KernelId id, int64_t start_ns, int64_t end_ns) {
  if (end_ns <= start_ns) return;
  const double sample = static_cast<double>(end_ns - start_ns);
  Entry* e = nullptr;
  {
    std::shared_lock lock(impl_->mu);
    auto it = impl_->by_id.find(id);
    if (it != impl_->by_id.end()) e = it->second.get();
  }
  if (e == nullptr) {
    std::unique_lock lock(impl_->mu);
    e = &impl_->get_or_create(id);
  }
  // Entries are never freed while the store lives, so `e` stays valid without the lock. The
  // first sample replaces an imported estimate; later ones blend in.
  const uint64_t n = e->samples.fetch_add(1, std::memory_order_relaxed);
  double old = e->duration_ns.load(std::memory_order_relaxed);
  double next;
  do {
    next = n == 0 ? sample : old + impl_->alpha * (sample - old);
  } while (!e->duration_ns.compare_exchange_weak(old, next, std::memory_order_relaxed));
}

void ProfileStore::set_profile(KernelId id, KernelProfile profile) {
  std::unique_lock lock(impl_->mu);
  impl_->get_or_create(id).profile.store(static_cast<int8_t>(profile), std::memory_order_relaxed);
}

uint64_t ProfileStore::samples(KernelId id) const {
  std::shared_lock lock(impl_->mu);
  auto it = impl_->by_id.find(id);
  return it == impl_->by_id.end() ? 0 : it->second->samples.load(std::memory_order_relaxed);
}

std::optional<KernelEntry> ProfileStore::find(KernelId id) const {
  std::shared_lock lock(impl_->mu);
  auto it = impl_->by_id.find(id);
  if (it == impl_->by_id.end()) return std::nullopt;
  const Entry& e = *it->second;
  KernelEntry out;
  out.id = e.id;
  out.name = e.name;
  out.profile = static_cast<KernelProfile>(e.profile.load(std::memory_order_relaxed));
  out.duration_ns = e.duration_ns.load(std::memory_order_relaxed);
  out.samples = e.samples.load(std::memory_order_relaxed);
  out.memory_footprint = e.memory_footprint;
  out.imported_sm_usage = e.imported_sm_usage;
  return out;
}

size_t ProfileStore::size() const {
  std::shared_lock lock(impl_->mu);
  return impl_->by_id.size();
}

size_t ProfileStore::import_orion_csv(std::istream& in, const std::string& source_name) {
  std::vector<detail::ProfileRow> rows = detail::parse_orion_csv(in, source_name);
  std::unique_lock lock(impl_->mu);
  for (const auto& row : rows) {
    impl_->imported[row.name] = row;
    for (auto& [id, e] : impl_->by_id) {
      if (e->name == row.name) Impl::apply(*e, row);
    }
  }
  return rows.size();
}

size_t ProfileStore::load_orion_csv(const std::string& path) {
  return detail::with_input_file(path, [&](std::istream& in) { return import_orion_csv(in, path); });
}

void ProfileStore::export_orion_csv(std::ostream& out) const {
  std::vector<detail::ProfileRow> rows;
  std::unordered_map<std::string, bool> written;
  std::shared_lock lock(impl_->mu);
  for (const auto& [id, e] : impl_->by_id) {
    if (e->name.empty() || written.count(e->name)) continue;
    written[e->name] = true;
    rows.push_back({e->name, static_cast<KernelProfile>(e->profile.load(std::memory_order_relaxed)),
                    e->memory_footprint, e->imported_sm_usage,
                    e->duration_ns.load(std::memory_order_relaxed)});
  }
  for (const auto& [name, row] : impl_->imported) {
    if (!written.count(name)) rows.push_back(row);
  }
  lock.unlock();
  detail::write_orion_csv(out, rows);
}

std::string ProfileStore::save_orion_csv(const std::string& path) const {
  return detail::with_output_file(path, [&](std::ostream& out) { export_orion_csv(out); });
}

}  // namespace sched
