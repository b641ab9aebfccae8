// The three registries. Function-local statics so a model's static registration object can run
// before or after this file's initialisers (no static-initialisation-order problem).
#include "trainer/model/registry.h"

namespace gpipe {

Registry<ModelInterface>& model_registry() {
  static Registry<ModelInterface> registry("model");
  return registry;
}

Registry<StageInterface>& stage_registry() {
  static Registry<StageInterface> registry("stage");
  return registry;
}

Registry<DatasetInterface>& dataset_registry() {
  static Registry<DatasetInterface> registry("dataset");
  return registry;
}

}  // namespace gpipe
