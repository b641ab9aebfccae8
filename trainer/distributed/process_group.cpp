// ProcessGroup (distributed.h): a c10d group over some of the processes. Gloo for CPU tensors,
// NCCL for CUDA tensors (CUDA builds with NCCL), both waited on through the monitor-aware
// Distributed::Impl::wait_collective so that a lost member ends a collective with its reason.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#ifdef OURGPIPE_HAVE_NCCL
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL 1  // what ProcessGroupNCCL.hpp is guarded by (set when torch is built with NCCL)
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>

#include <fmt/format.h>

#include "distributed_internal.h"
#include "trainer/config/config.h"

namespace gpipe {

struct ProcessGroup::Impl {
  Distributed::Impl* dist = nullptr;
  std::string name, backend_name;
  int rank = 0;
  std::vector<int> members;
  c10::intrusive_ptr<c10d::Backend> backend;
};

struct ProcessGroup::Pending::Impl {
  ProcessGroup::Impl* group = nullptr;
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> tensors;  // alive until the collective is done
};

ProcessGroup::Pending::Pending() = default;
ProcessGroup::Pending::Pending(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::Pending::Pending(Pending&&) noexcept = default;
ProcessGroup::Pending& ProcessGroup::Pending::operator=(Pending&&) noexcept = default;
ProcessGroup::Pending::~Pending() = default;

void ProcessGroup::Pending::wait() {
  if (!impl_) throw std::logic_error("ProcessGroup::Pending::wait: nothing was started");
  impl_->group->dist->wait_collective(impl_->work, fmt::format("all-reduce in process group {}", impl_->group->name));
  impl_.reset();
}

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;
const std::string& ProcessGroup::name() const { return impl_->name; }
const std::string& ProcessGroup::backend() const { return impl_->backend_name; }
int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::size() const { return static_cast<int>(impl_->members.size()); }
const std::vector<int>& ProcessGroup::members() const { return impl_->members; }

std::vector<double> ProcessGroup::all_reduce_sum(std::vector<double> values) {
  if (impl_->backend_name != "gloo") {
    throw std::logic_error("ProcessGroup::all_reduce_sum(values) needs a gloo group; " + impl_->name + " is " +
                           impl_->backend_name);
  }
  at::Tensor t = at::tensor(values, at::kDouble);
  start_all_reduce_sum(t).wait();
  return {t.data_ptr<double>(), t.data_ptr<double>() + t.numel()};
}

void ProcessGroup::all_reduce_sum_in_place(at::Tensor& tensor) { start_all_reduce_sum(tensor).wait(); }

ProcessGroup::Pending ProcessGroup::start_all_reduce_sum(at::Tensor tensor) {
  const bool cuda = tensor.is_cuda();
  if (!tensor.is_contiguous() || cuda != (impl_->backend_name == "nccl")) {
    throw std::invalid_argument(fmt::format("process group {} ({}) sums contiguous {} tensors, got a {}{} tensor",
                                            impl_->name, impl_->backend_name, impl_->backend_name == "nccl" ? "CUDA" : "CPU",
                                            tensor.is_contiguous() ? "" : "non-contiguous ", tensor.device().str()));
  }
  auto pending = std::make_unique<Pending::Impl>();
  pending->group = impl_.get();
  pending->tensors = {std::move(tensor)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  pending->work = impl_->backend->allreduce(pending->tensors, options);
  return Pending(std::move(pending));
}

std::unique_ptr<ProcessGroup> make_process_group(Distributed::Impl& dist, std::string name, std::string backend_name,
                                                 int rank, std::vector<int> members,
                                                 c10::intrusive_ptr<c10d::Backend> backend) {
  auto impl = std::make_unique<ProcessGroup::Impl>();
  impl->dist = &dist;
  impl->name = std::move(name);
  impl->backend_name = std::move(backend_name);
  impl->rank = rank;
  impl->members = std::move(members);
  impl->backend = std::move(backend);
  return std::make_unique<ProcessGroup>(std::move(impl));
}

std::unique_ptr<ProcessGroup> Distributed::new_group(const std::string& name, std::vector<int> members,
                                                     const std::string& backend) {
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  const auto me = std::find(members.begin(), members.end(), rank());
  if (me == members.end()) {
    throw std::logic_error(fmt::format("rank {} makes process group {} without being one of its members", rank(), name));
  }
  for (int m : members) {
    if (m < 0 || m >= world_size()) {
      throw std::logic_error(fmt::format("process group {}: member {} is not a rank of WORLD_SIZE={}", name, m, world_size()));
    }
  }
  const int group_rank = static_cast<int>(me - members.begin());
  const int size = static_cast<int>(members.size());
  auto store = c10::make_intrusive<c10d::PrefixStore>("group/" + name, impl_->store);
  c10::intrusive_ptr<c10d::Backend> backend_ptr;
  std::string members_text;
  for (int m : members) members_text += (members_text.empty() ? "" : ",") + std::to_string(m);
  try {
    if (backend == "gloo") {
      backend_ptr = make_gloo_backend(store, group_rank, size, impl_->options.timeout);
    } else if (backend == "nccl") {
#ifdef OURGPIPE_HAVE_NCCL
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = impl_->options.timeout;
#ifndef NCCL_HAS_CONFIG
#warning "this NCCL has no ncclConfig_t: replicated stages' NCCL groups stay blocking (a lost member is not bounded)"
#endif
#ifdef NCCL_HAS_CONFIG
      // Non-blocking communicator: its creation (at the first all-reduce, inside backward) is
      // polled and bounded (Distributed::connect sets TORCH_NCCL_NONBLOCKING_TIMEOUT), where a
      // blocking one waits for a member that never comes for ever.
      options->config.blocking = 0;
#endif
      backend_ptr = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, group_rank, size, options);
      bool failed = false;
      {
        std::lock_guard<std::mutex> lock(impl_->mu);
        std::erase_if(impl_->nccl_groups, [](const auto& weak) { return weak.expired(); });
        impl_->nccl_groups.push_back(c10::weak_intrusive_ptr<c10d::Backend>(backend_ptr));
        failed = impl_->failure.has_value();
      }
      if (failed) backend_ptr->abort();  // outside the lock, as Impl::fail does
#else
      throw ConfigError("process group " + name + " needs NCCL (CUDA stages) but this build has none: configure on a "
                        "machine with the CUDA toolkit and LibTorch-CUDA");
#endif
    } else {
      throw std::logic_error("process group backend '" + backend + "' is neither gloo nor nccl");
    }
  } catch (const ConfigError&) {
    throw;
  } catch (const std::logic_error&) {
    throw;
  } catch (const std::exception& e) {
    throw RendezvousError(fmt::format("rank {} could not form the {} process group {} with ranks {} within {} s: {} "
                                      "(a member failed or was started with another configuration)",
                                      rank(), backend, name, members_text, impl_->options.timeout.count() / 1000.0,
                                      error_text(e)));
  }
  return make_process_group(*impl_, name, backend, group_rank, std::move(members), std::move(backend_ptr));
}

}  // namespace gpipe
