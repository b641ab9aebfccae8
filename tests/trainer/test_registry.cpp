// Registries: the GPT, BERT and their datasets are registered; unknown names list the registered ones.
#include <gtest/gtest.h>

#include <algorithm>

#include "trainer/model/registry.h"

namespace gpipe::test {
namespace {

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

TEST(Registry, ModelsStagesAndDatasetsAreRegistered) {
  EXPECT_TRUE(contains(model_registry().names(), "gpt"));
  EXPECT_TRUE(contains(stage_registry().names(), "gpt"));
  EXPECT_TRUE(contains(dataset_registry().names(), "code_search_net"));
  EXPECT_TRUE(contains(dataset_registry().names(), "text"));
  EXPECT_NE(model_registry().create("gpt"), nullptr);
  EXPECT_TRUE(contains(model_registry().names(), "bert"));
  EXPECT_TRUE(contains(stage_registry().names(), "bert"));
  for (const char* dataset : {"bert", "bert_code_search_net", "bert_text"}) {
    EXPECT_TRUE(contains(dataset_registry().names(), dataset)) << dataset;
  }
  EXPECT_NE(model_registry().create("bert"), nullptr);
  EXPECT_NE(stage_registry().create("bert"), nullptr);
}

TEST(Registry, UnknownNameListsTheRegisteredOnes) {
  try {
    dataset_registry().create("imagenet");
    FAIL() << "an unknown dataset must throw";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("imagenet"), std::string::npos) << what;
    EXPECT_NE(what.find("code_search_net"), std::string::npos) << what;
    EXPECT_NE(what.find("text"), std::string::npos) << what;
  }
  EXPECT_THROW(model_registry().create("llama"), std::invalid_argument);
}

TEST(Registry, DuplicateRegistrationIsRefused) {
  EXPECT_FALSE(model_registry().add("gpt", [] { return std::unique_ptr<ModelInterface>(); }));
}

}  // namespace
}  // namespace gpipe::test
