// The fake driver's green contexts (CUDA 12.4+ driver API): SM resources, splits, descriptors,
// green contexts and their streams, with the rules the real driver documents:
//  - device 0 splits like sm_90 (groups of at least 8 SMs, multiples of 8), device 1 like sm_80
//    (at least 4, multiples of 2); a split's groups come from a device's (or a green context's)
//    whole resource, never from another split's output;
//  - a descriptor takes resources of one device and one split;
//  - cuGreenCtxCreate needs CU_GREEN_CTX_DEFAULT_STREAM; cuGreenCtxStreamCreate needs
//    CU_STREAM_NON_BLOCKING and ignores the calling thread's context;
//  - a green context's CUcontext (cuCtxFromGreenCtx) is a context of its own: its streams are used
//    with it current, only CUkernels (not a primary context's CUfunctions) launch in it, and an
//    event records only on streams of its own context (the existing stream/launch/event rules);
//  - a green context retains its device's primary context; cuGreenCtxDestroy releases it (the
//    last release ends the primary context) and leaves its streams answering
//    CUDA_ERROR_CONTEXT_IS_DESTROYED, cuStreamDestroy included (CUDA 13's cuda.h);
//  - a green context may be current to one thread at a time: a second thread making it current
//    is counted (fake_cuda_green_ctx_violations), since the real driver does not say what happens.
// The resource structs carry the fake's bookkeeping in their internal padding, as the real
// driver's do.
#include "fake_cuda_state.h"  // first: it selects cuda.h's internal (all-variants) mode

#include <algorithm>
#include <cstring>
#include <set>

namespace fake_cuda_impl {
namespace {

constexpr uint32_t kResourceMagic = 0x6FEE4C7u;
constexpr uint64_t kGreenToContext = 0x8;  // a green context's CUcontext differs from its handle

// In the internal padding of CUdevResource.
struct ResourceTag {
  uint32_t magic;
  int32_t device;
  uint64_t split;  // 0: a whole resource (device or green context); else the split it came from
};
static_assert(sizeof(ResourceTag) <= sizeof(CUdevResource::_internal_padding));

ResourceTag tag_of(const CUdevResource& r) {
  ResourceTag t;
  std::memcpy(&t, r._internal_padding, sizeof t);
  return t;
}
void set_tag(CUdevResource& r, ResourceTag t) { std::memcpy(r._internal_padding, &t, sizeof t); }

struct Green {
  int device = 0;
  unsigned sms = 0;
  uint64_t ctx = 0;
  std::set<uint64_t> current_on;  // thread tokens
};
struct Desc {
  int device = 0;
  unsigned sms = 0;
};

// Own lock: device_of() is called with and without st().mu held.
std::mutex& green_mu() {
  static std::mutex mu;
  return mu;
}
std::unordered_map<uint64_t, Green>& greens() {  // by green handle
  static std::unordered_map<uint64_t, Green> g;
  return g;
}
std::unordered_map<uint64_t, Desc>& descs() {
  static std::unordered_map<uint64_t, Desc> d;
  return d;
}
std::set<uint64_t>& ended_contexts() {  // CUcontexts of destroyed green contexts
  static std::set<uint64_t> e;
  return e;
}
uint64_t g_next_split = 1;
uint64_t g_violations = 0;

unsigned min_partition(int device) { return device == 0 ? 8 : 4; }
unsigned alignment(int device) { return device == 0 ? 8 : 2; }

Green* green_by_ctx(uint64_t ctx) {
  for (auto& [h, g] : greens()) {
    if (g.ctx == ctx) return &g;
  }
  return nullptr;
}

}  // namespace

int green_device(uint64_t ctx) {
  std::lock_guard lock(green_mu());
  const Green* g = green_by_ctx(ctx);
  return g == nullptr ? -1 : g->device;
}

bool green_ended(uint64_t ctx) {
  std::lock_guard lock(green_mu());
  return ended_contexts().count(ctx) != 0;
}

void green_current_changed(uint64_t before, uint64_t after) {
  if (before == after) return;
  std::lock_guard lock(green_mu());
  const uint64_t self = thread_token();
  if (Green* g = green_by_ctx(before)) g->current_on.erase(self);
  if (Green* g = green_by_ctx(after)) {
    g->current_on.insert(self);
    if (g->current_on.size() > 1) ++g_violations;
  }
}

}  // namespace fake_cuda_impl

using namespace fake_cuda_impl;

FAKE_EXPORT uint64_t fake_cuda_green_ctx_violations(void) {
  std::lock_guard lock(green_mu());
  return g_violations;
}

FAKE_EXPORT int fake_cuda_context_sm_count(CUcontext ctx) {
  const auto v = reinterpret_cast<uint64_t>(ctx);
  for (int d = 0; d < kDevices; ++d) {
    if (kPrimaryContext[d] == v) return kSmCount[d];
  }
  std::lock_guard lock(green_mu());
  const Green* g = green_by_ctx(v);
  return g == nullptr ? -1 : static_cast<int>(g->sms);
}

FAKE_EXPORT CUresult CUDAAPI cuDeviceGetDevResource(CUdevice dev, CUdevResource* out, CUdevResourceType type) {
  {
    State& s = st();
    std::lock_guard lock(s.mu);
    fake_cuda_call& c = begin(s, "cuDeviceGetDevResource");
    c.value = static_cast<uint64_t>(dev);
    if (out == nullptr) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
    if (dev < 0 || dev >= kDevices) return finish(s, c, CUDA_ERROR_INVALID_DEVICE);
    if (type != CU_DEV_RESOURCE_TYPE_SM) return finish(s, c, CUDA_ERROR_INVALID_RESOURCE_TYPE);
    CUresult rc = finish(s, c);
    if (rc != CUDA_SUCCESS) return rc;
  }
  std::memset(out, 0, sizeof *out);
  out->type = CU_DEV_RESOURCE_TYPE_SM;
  out->sm.smCount = static_cast<unsigned>(kSmCount[dev]);
  out->sm.minSmPartitionSize = min_partition(dev);
  out->sm.smCoscheduledAlignment = alignment(dev);
  set_tag(*out, {kResourceMagic, dev, 0});
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult CUDAAPI cuDevSmResourceSplitByCount(CUdevResource* result, unsigned int* nb_groups,
                                                         const CUdevResource* input, CUdevResource* remaining,
                                                         unsigned int use_flags, unsigned int min_count) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuDevSmResourceSplitByCount");
  c.value = min_count;
  if (nb_groups == nullptr || input == nullptr) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  if (input->type != CU_DEV_RESOURCE_TYPE_SM) return finish(s, c, CUDA_ERROR_INVALID_RESOURCE_TYPE);
  const ResourceTag in = tag_of(*input);
  if (in.magic != kResourceMagic) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  // "The output results cannot be split again without first creating a descriptor and a green
  // context with that descriptor."
  if (in.split != 0) return finish(s, c, CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  if ((use_flags & ~static_cast<unsigned>(CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING)) != 0) {
    return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  }
  if (min_count > input->sm.smCount) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  const bool fine = (use_flags & CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING) != 0;
  const unsigned align = fine ? 1 : alignment(in.device);
  unsigned count = std::max(min_count, fine ? 1u : min_partition(in.device));
  count = (count + align - 1) / align * align;  // rounded up to the granularity
  const unsigned possible = count == 0 ? 0 : input->sm.smCount / count;
  if (result == nullptr) {
    *nb_groups = possible;
    return finish(s, c);
  }
  const unsigned n = std::min(*nb_groups, possible);
  if (n == 0) return finish(s, c, CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  CUresult rc = finish(s, c);
  if (rc != CUDA_SUCCESS) return rc;
  const uint64_t split = g_next_split++;
  for (unsigned i = 0; i < n; ++i) {
    std::memset(&result[i], 0, sizeof result[i]);
    result[i].type = CU_DEV_RESOURCE_TYPE_SM;
    result[i].sm.smCount = count;
    result[i].sm.minSmPartitionSize = input->sm.minSmPartitionSize;
    result[i].sm.smCoscheduledAlignment = input->sm.smCoscheduledAlignment;
    set_tag(result[i], {kResourceMagic, in.device, split});
  }
  if (remaining != nullptr) {
    std::memset(remaining, 0, sizeof *remaining);
    remaining->type = CU_DEV_RESOURCE_TYPE_SM;
    remaining->sm.smCount = input->sm.smCount - n * count;
    remaining->sm.minSmPartitionSize = input->sm.minSmPartitionSize;
    remaining->sm.smCoscheduledAlignment = input->sm.smCoscheduledAlignment;
    set_tag(*remaining, {kResourceMagic, in.device, split});
  }
  *nb_groups = n;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult CUDAAPI cuDevResourceGenerateDesc(CUdevResourceDesc* out, CUdevResource* resources,
                                                       unsigned int n) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuDevResourceGenerateDesc");
  c.value = n;
  if (out == nullptr || resources == nullptr || n == 0) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  Desc d;
  const ResourceTag first = tag_of(resources[0]);
  for (unsigned i = 0; i < n; ++i) {
    if (resources[i].type != CU_DEV_RESOURCE_TYPE_SM) return finish(s, c, CUDA_ERROR_INVALID_RESOURCE_TYPE);
    const ResourceTag t = tag_of(resources[i]);
    if (t.magic != kResourceMagic) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
    // One device, and SM resources from one split instance.
    if (t.device != first.device || t.split != first.split) {
      return finish(s, c, CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    }
    d.sms += resources[i].sm.smCount;
  }
  d.device = first.device;
  CUresult rc = finish(s, c);
  if (rc != CUDA_SUCCESS) return rc;
  const uint64_t h = (s.next_handle += 0x100);
  std::lock_guard glock(green_mu());
  descs()[h] = d;
  *out = reinterpret_cast<CUdevResourceDesc>(h);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult CUDAAPI cuGreenCtxCreate(CUgreenCtx* out, CUdevResourceDesc desc, CUdevice dev,
                                              unsigned int flags) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuGreenCtxCreate");
  c.value = reinterpret_cast<uint64_t>(desc);
  if (out == nullptr) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  if (dev < 0 || dev >= kDevices) return finish(s, c, CUDA_ERROR_INVALID_DEVICE);
  if (flags != CU_GREEN_CTX_DEFAULT_STREAM) return finish(s, c, CUDA_ERROR_INVALID_VALUE);  // required
  std::lock_guard glock(green_mu());
  auto it = descs().find(reinterpret_cast<uint64_t>(desc));
  if (it == descs().end()) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  if (it->second.device != dev) return finish(s, c, CUDA_ERROR_INVALID_DEVICE);
  CUresult rc = finish(s, c);
  if (rc != CUDA_SUCCESS) return rc;
  const uint64_t h = (s.next_handle += 0x100);
  Green g;
  g.device = dev;
  g.sms = it->second.sms;
  g.ctx = h + kGreenToContext;
  greens()[h] = g;
  primary_retain(dev);  // "destroys the green context, releasing the primary context"
  *out = reinterpret_cast<CUgreenCtx>(h);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult CUDAAPI cuGreenCtxDestroy(CUgreenCtx g) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuGreenCtxDestroy");
  c.value = reinterpret_cast<uint64_t>(g);
  Green gone;
  {
    std::lock_guard glock(green_mu());
    auto it = greens().find(reinterpret_cast<uint64_t>(g));
    if (it == greens().end()) return finish(s, c, CUDA_ERROR_INVALID_CONTEXT);
    gone = it->second;
  }
  const CUresult rc = finish(s, c);
  if (rc != CUDA_SUCCESS) return rc;
  {
    std::lock_guard glock(green_mu());
    greens().erase(reinterpret_cast<uint64_t>(g));
    ended_contexts().insert(gone.ctx);
  }
  // Its streams stay (leaked, answering CUDA_ERROR_CONTEXT_IS_DESTROYED). What becomes of its
  // events the driver does not say: the fake takes them along, the harder case for the shim.
  take_context_along(s, gone.ctx, CUDA_ERROR_CONTEXT_IS_DESTROYED);
  // The green context's own retain goes (a test that released the device's retains past it,
  // release_primary_retains, left none: nothing to release, and the destroy still succeeded).
  (void)primary_release(s, gone.device);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult CUDAAPI cuCtxFromGreenCtx(CUcontext* out, CUgreenCtx g) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard glock(green_mu());
  auto it = greens().find(reinterpret_cast<uint64_t>(g));
  if (it == greens().end()) return CUDA_ERROR_INVALID_CONTEXT;
  *out = reinterpret_cast<CUcontext>(it->second.ctx);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult CUDAAPI cuGreenCtxStreamCreate(CUstream* out, CUgreenCtx g, unsigned int flags, int priority) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuGreenCtxStreamCreate");
  c.value = static_cast<uint64_t>(static_cast<int64_t>(priority));
  if (out == nullptr) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  if ((flags & CU_STREAM_NON_BLOCKING) == 0) return finish(s, c, CUDA_ERROR_INVALID_VALUE);  // required
  uint64_t ctx = 0;
  {
    std::lock_guard glock(green_mu());
    auto it = greens().find(reinterpret_cast<uint64_t>(g));
    if (it == greens().end()) return finish(s, c, CUDA_ERROR_INVALID_CONTEXT);
    ctx = it->second.ctx;
  }
  CUresult rc = finish(s, c);
  if (rc != CUDA_SUCCESS) return rc;
  const uint64_t h = (s.next_handle += 0x100);
  Stream& str = s.streams[h];
  str.priority = priority;
  str.ctx = ctx;  // the green context's, whatever is current
  str.flags = flags;
  c.stream = h;
  c.context = ctx;
  *out = reinterpret_cast<CUstream>(h);
  return CUDA_SUCCESS;
}
