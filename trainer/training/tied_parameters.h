// Private to the PipelineTrainer sources: the copies of the model's tied parameters
// (ModelInterface::tied_parameters, TiedParameter in trainer/model/interfaces.h) over the stages.
//
// A group's members on one stage are one tensor (the stage module shares it); members on different
// stages are copies. The trainer keeps the copies equal: synchronize_values() when the stages are
// built (the first member's values into every copy), reduce_gradients() after every step's
// backward (each copy's gradient becomes the sum of all copies', so the per-stage optimizers take
// identical steps); the gradient norm and the parameter count skip every copy but the first
// member's (is_duplicate). Copies in one process are summed directly; a group whose copies live in
// several processes is summed by a Gloo all-reduce over the pipeline replica's processes (those
// holding no copy add zeros), in the same group order everywhere.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <unordered_set>
#include <vector>

#include "trainer/model/interfaces.h"
#include "trainer/partition/placement.h"
#include "trainer/schedule/schedule.h"

namespace gpipe {

class ProcessGroup;
class StageRuntime;

class TiedParameters {
 public:
  // `stages` is indexed by virtual stage (null for other processes' stages), `specs` covers every
  // stage. Throws std::logic_error when a stage module does not expose a member it holds
  // (StageModule::layer_parameter) or a copy has another shape than the group's.
  TiedParameters(const ModelInterface& model, const std::vector<StageSpec>& specs,
                 const std::vector<std::unique_ptr<StageRuntime>>& stages, const Schedule& schedule,
                 const Placement& placement, ProcessGroup* replica_processes);

  bool empty() const { return groups_.empty(); }
  void synchronize_values();
  void reduce_gradients();
  // A copy that the gradient norm and the parameter count leave out (not the owner's copy).
  bool is_duplicate(const at::Tensor& parameter) const {
    return duplicates_.count(parameter.unsafeGetTensorImpl()) != 0;
  }

 private:
  struct Group {
    TiedParameter tied;
    std::vector<at::Tensor> copies;  // distinct local tensors; the owner's first when it is local
    bool owner_local = false;
    bool spans_processes = false;
  };
  // Sums `parts` (some may be undefined) on the device of the first copy; zeros when none, and
  // across processes when the group spans them.
  at::Tensor total(const Group& group, const std::vector<at::Tensor>& parts) const;

  std::vector<Group> groups_;
  std::unordered_set<const c10::TensorImpl*> duplicates_;
  ProcessGroup* group_ = nullptr;  // this replica's processes; null in a single process
};

}  // namespace gpipe
