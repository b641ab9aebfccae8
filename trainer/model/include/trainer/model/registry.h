// Registries by name (the seed's MODEL_REGISTRY, STAGE_REGISTRY, DATASET_REGISTRY). A model
// registers itself with a static object, so its library must be linked whole (the models are
// an OBJECT library linked into gpipe_runner and the tests).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "trainer/model/interfaces.h"

namespace gpipe {

template <typename T>
class Registry {
 public:
  using Factory = std::function<std::unique_ptr<T>()>;
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  bool add(const std::string& name, Factory factory) {
    std::lock_guard<std::mutex> lock(mu_);
    return factories_.emplace(name, std::move(factory)).second;
  }
  // Throws std::invalid_argument naming the unknown key and the registered ones.
  std::unique_ptr<T> create(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = factories_.find(name);
    if (it == factories_.end()) {
      std::string known;
      for (const auto& [k, v] : factories_) known += (known.empty() ? "" : ", ") + k;
      throw std::invalid_argument("unknown " + kind_ + " '" + name + "' (registered: " +
                                  (known.empty() ? "none" : known) + ")");
    }
    return it->second();
  }
  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& [k, v] : factories_) out.push_back(k);
    return out;
  }

 private:
  std::string kind_;
  mutable std::mutex mu_;
  std::map<std::string, Factory> factories_;
};

Registry<ModelInterface>& model_registry();
Registry<StageInterface>& stage_registry();
Registry<DatasetInterface>& dataset_registry();

}  // namespace gpipe

#define GPIPE_REGISTER_IMPL(registry, name, Type, tag)                                        \
  static const bool gpipe_registered_##tag##_##Type = ::gpipe::registry().add(              \
      name, [] { return std::make_unique<Type>(); })
// GPIPE_REGISTER_MODEL("gpt", GptModel);
#define GPIPE_REGISTER_MODEL(name, Type) GPIPE_REGISTER_IMPL(model_registry, name, Type, model)
#define GPIPE_REGISTER_STAGE(name, Type) GPIPE_REGISTER_IMPL(stage_registry, name, Type, stage)
#define GPIPE_REGISTER_DATASET(name, Type) GPIPE_REGISTER_IMPL(dataset_registry, name, Type, dataset)
