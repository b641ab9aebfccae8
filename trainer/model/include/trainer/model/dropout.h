// Where dropout draws its masks. A stage's forward runs on whichever thread the executor gives it
// (a rank thread, a forward lane), in an order the schedule decides, and in as many processes as
// the layout has: drawing from the process-wide generator made the masks depend on how threads
// interleaved, and gave every data-parallel replica the same masks. Instead each draw is seeded
// from where it is in the training run: (run seed, step, global micro-batch, model layer, site
// within the layer). A micro-batch gets the same masks under any schedule, executor, partition,
// placement or data-parallel layout, and a resumed run the same as an uninterrupted one (as
// Megatron's model-parallel RNG tracker keeps masks a function of position, not of history).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <optional>

namespace gpipe {

struct DropoutOrigin {
  uint64_t seed = 0;       // training.seed
  int64_t step = 0;        // the optimizer step the micro-batch belongs to
  int64_t microbatch = 0;  // its index in the step's global batch (over every replica)
};

// While alive, this thread's forwards draw their dropout masks from `origin` (scopes nest).
class DropoutScope {
 public:
  explicit DropoutScope(const DropoutOrigin& origin);
  ~DropoutScope();
  DropoutScope(const DropoutScope&) = delete;
  DropoutScope& operator=(const DropoutScope&) = delete;

 private:
  std::optional<DropoutOrigin> previous_;
};

// The generator seed of draw `site` of model layer `layer` in this thread's scope (nullopt
// outside one).
std::optional<uint64_t> dropout_seed(int64_t layer, int site);

// A CPU generator of this draw's own, seeded dropout_seed(layer, site) (nullopt outside a scope):
// CPU masks are drawn from it, so rank threads never share, or wait for, a generator.
std::optional<at::Generator> cpu_dropout_generator(int64_t layer, int site);

// For CUDA's fused kernels (at::dropout, dropout inside scaled_dot_product_attention), which draw
// from the device's default generator: runs `draw` with that generator seeded
// dropout_seed(layer, site), restoring its state afterwards; outside a scope it simply runs
// `draw`. Draws of a process take turns while they launch (the kernels read the seed at launch).
at::Tensor with_dropout_seed(c10::Device device, int64_t layer, int site, const std::function<at::Tensor()>& draw);

}  // namespace gpipe
