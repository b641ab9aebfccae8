// What the scheduler knows about each kernel: name, profile (compute/memory bound), a duration
// estimate learned online from completions, SMs needed per launch shape, memory footprint.
// Thread-safe; estimate() is on every best-effort launch's path and takes only a shared lock.
// Imports/exports Orion's offline profile CSV: `Name,Profile,Memory_footprint,SM_usage,Duration`
// (Profile 1 compute / 0 memory / -1 unknown; Duration in ns). Imported rows are matched by kernel
// name when a kernel with that name first appears.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "scheduler/device.h"
#include "scheduler/op.h"
#include "scheduler/policy.h"

namespace sched {

struct KernelEntry {
  KernelId id = 0;
  std::string name;
  KernelProfile profile = KernelProfile::kUnknown;
  double duration_ns = 0;         // EWMA of observed durations (or imported); 0: unknown
  uint64_t samples = 0;           // completions learned from
  uint64_t memory_footprint = 0;  // imported only (Orion's Memory_footprint column)
  int imported_sm_usage = 0;      // imported only (Orion's SM_usage column)
};

class ProfileStore {
 public:
  // `ewma_alpha`: weight of a new duration sample (0 < alpha <= 1).
  explicit ProfileStore(double ewma_alpha = 0.25);
  ~ProfileStore();
  ProfileStore(const ProfileStore&) = delete;
  ProfileStore& operator=(const ProfileStore&) = delete;

  // Registers a kernel's name (first sight applies an imported row of that name) and returns a
  // pointer to the name that stays valid for the store's lifetime (for KernelInfo::name). A known
  // id registered under another name is a reused handle (its module was unloaded): it starts
  // afresh, learning nothing from the kernel that had the address before.
  const char* register_kernel(KernelId id, std::string_view name);

  // Estimate for one launch: learned/imported duration and profile (a known profile_hint wins),
  // and SMs needed, from `device` once per (kernel, block, shared memory) and cached.
  OpEstimate estimate(const KernelInfo& kernel, Device& device);
  // Profile of a kernel already seen (kUnknown otherwise).
  KernelProfile profile_of(KernelId id) const;
  // Completions learned from for a kernel (0 for one never seen); cheap, no copy.
  uint64_t samples(KernelId id) const;

  // Learns from a finished kernel (ignored when end <= start: the backend could not time it).
  void record_completion(KernelId id, int64_t start_ns, int64_t end_ns);
  // Sets a kernel's profile (e.g. from a workload file or a measurement tool).
  void set_profile(KernelId id, KernelProfile profile);

  std::optional<KernelEntry> find(KernelId id) const;
  size_t size() const;

  // Orion CSV. import_* throw std::invalid_argument naming the source, line and field; rows are
  // kept by name until a kernel with that name is registered (and applied at once to kernels
  // already registered under that name). Returns the number of rows read.
  size_t import_orion_csv(std::istream& in, const std::string& source_name = "<stream>");
  size_t load_orion_csv(const std::string& path);
  // Writes one row per named kernel seen (and per imported row not matched yet).
  void export_orion_csv(std::ostream& out) const;
  // Returns "" on success, else an error naming the path and the cause.
  std::string save_orion_csv(const std::string& path) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sched
