#include "trainer/model/dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <array>
#include <mutex>
#include <random>

namespace gpipe {
namespace {

thread_local std::optional<DropoutOrigin> t_origin;
std::mutex g_draw_mu;  // one seeded draw at a time: they share the device's default generator

}  // namespace

DropoutScope::DropoutScope(const DropoutOrigin& origin) : previous_(t_origin) { t_origin = origin; }

DropoutScope::~DropoutScope() { t_origin = previous_; }

std::optional<uint64_t> dropout_seed(int64_t layer, int site) {
  if (!t_origin) return std::nullopt;
  const auto words = [](uint64_t v) { return std::array<uint32_t, 2>{static_cast<uint32_t>(v), static_cast<uint32_t>(v >> 32)}; };
  const auto seed = words(t_origin->seed), step = words(static_cast<uint64_t>(t_origin->step));
  const auto mb = words(static_cast<uint64_t>(t_origin->microbatch)), at = words(static_cast<uint64_t>(layer));
  std::seed_seq mix{seed[0], seed[1], step[0], step[1], mb[0], mb[1], at[0], at[1], static_cast<uint32_t>(site)};
  std::array<uint32_t, 2> out{};
  mix.generate(out.begin(), out.end());
  return (static_cast<uint64_t>(out[0]) << 32) | out[1];
}

std::optional<at::Generator> cpu_dropout_generator(int64_t layer, int site) {
  const std::optional<uint64_t> seed = dropout_seed(layer, site);
  if (!seed) return std::nullopt;
  return at::make_generator<at::CPUGeneratorImpl>(*seed);
}

at::Tensor with_dropout_seed(c10::Device device, int64_t layer, int site, const std::function<at::Tensor()>& draw) {
  const std::optional<uint64_t> seed = dropout_seed(layer, site);
  if (!seed) return draw();
  std::lock_guard turn(g_draw_mu);
  at::Generator generator = at::globalContext().defaultGenerator(device);
  at::Tensor saved;
  {
    std::lock_guard lock(generator.mutex());
    saved = generator.get_state();
    generator.set_current_seed(*seed);
  }
  struct Restore {  // also when draw() throws
    at::Generator& generator;
    const at::Tensor& state;
    ~Restore() {
      try {
        std::lock_guard lock(generator.mutex());
        generator.set_state(state);
      } catch (const std::exception&) {
        // The state just read back cannot be refused; a destructor must not throw either way.
      }
    }
  } restore{generator, saved};
  return draw();
}

}  // namespace gpipe
