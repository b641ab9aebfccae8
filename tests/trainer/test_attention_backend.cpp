// model.attention (trainer/model/attention_backend.h): the switches reach ATen's SDPA, the chosen
// kernel is reported, and a kernel that cannot run the model is refused by name with ATen's reason.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "trainer/config/config.h"
#include "trainer/model/attention_backend.h"

namespace gpipe {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

// Leaves ATen's process-wide switches as PyTorch starts them, whatever a test did.
class AttentionBackendTest : public ::testing::Test {
 protected:
  void TearDown() override { use_attention_backend("auto"); }
  static AttentionShape gpt_tiny() {
    AttentionShape s;
    s.num_heads = 4, s.sequence_length = 32, s.head_dim = 16, s.causal = true;
    return s;
  }
  static at::Tensor heads(uint64_t seed) {
    at::manual_seed(seed);
    return at::randn({2, 4, 32, 16}).requires_grad_(true);
  }
};

TEST_F(AttentionBackendTest, TheNamedCpuKernelIsTheOneChosen) {
  EXPECT_EQ(select_attention_backend("math", gpt_tiny(), c10::kCPU, at::kFloat), "math");
  EXPECT_EQ(select_attention_backend("flash", gpt_tiny(), c10::kCPU, at::kFloat), "flash");
  // auto is PyTorch's own order again after a named kernel: both CPU kernels are back on.
  EXPECT_THAT(select_attention_backend("auto", gpt_tiny(), c10::kCPU, at::kFloat), AnyOf("flash", "math"));
  EXPECT_TRUE(at::globalContext().userEnabledMathSDP());
  EXPECT_TRUE(at::globalContext().userEnabledFlashSDP());
}

TEST_F(AttentionBackendTest, TheSwitchesReachScaledDotProductAttention) {
  // With flash alone, a dropout the CPU flash kernel does not take has no kernel left: the op
  // itself refuses, so the setting is what SDPA obeys, not only what the chooser reports.
  use_attention_backend("flash");
  EXPECT_THROW(at::scaled_dot_product_attention(heads(1), heads(2), heads(3), std::nullopt, 0.5, true), c10::Error);
  use_attention_backend("math");
  const at::Tensor q = heads(1), k = heads(2), v = heads(3);
  const at::Tensor math = at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, true);
  use_attention_backend("flash");
  const at::Tensor flash = at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, true);
  EXPECT_TRUE(at::allclose(math, flash, 1e-5, 1e-5));
}

TEST_F(AttentionBackendTest, CudaKernelsOnCpuAreRefusedByName) {
  for (const char* name : {"cudnn", "efficient"}) {
    try {
      select_attention_backend(name, gpt_tiny(), c10::kCPU, at::kFloat);
      ADD_FAILURE() << name << " was accepted on the CPU";
    } catch (const ConfigError& e) {
      EXPECT_TRUE(at::globalContext().userEnabledFlashSDP()) << "a refusal changed the switches";
      EXPECT_THAT(e.what(), HasSubstr(std::string("model.attention=") + name + " is a CUDA kernel"));
      EXPECT_THAT(e.what(), HasSubstr("use auto, flash or math"));
    }
  }
}

TEST_F(AttentionBackendTest, AKernelThatCannotRunTheModelGivesAtensReason) {
  AttentionShape with_dropout = gpt_tiny();
  with_dropout.dropout = 0.1;
  try {
    select_attention_backend("flash", with_dropout, c10::kCPU, at::kFloat);
    ADD_FAILURE() << "flash with dropout was accepted on the CPU";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.attention=flash cannot run this model's attention (4 heads x 32 "
                                    "positions x head dim 16, causal) on cpu"));
    EXPECT_THAT(e.what(), HasSubstr("dropout"));
    EXPECT_THAT(e.what(), HasSubstr("Use model.attention=auto"));
  }
  // The refusal left the switches as they were (auto's), not on flash alone.
  EXPECT_TRUE(at::globalContext().userEnabledMathSDP());
  // auto falls back to a kernel that can (math).
  EXPECT_EQ(select_attention_backend("auto", with_dropout, c10::kCPU, at::kFloat), "math");
}

TEST_F(AttentionBackendTest, AnUnknownNameIsRefused) {
  try {
    use_attention_backend("fa3");
    ADD_FAILURE() << "fa3 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.attention='fa3' is not one of auto, flash, efficient, cudnn, math"));
  }
}

// On the GPU: each kernel either is the one chosen for the 350M GPT's attention in bf16 and runs a
// forward and backward, or is refused naming itself; auto picks one of them (an H100 with cuDNN
// >= 9.15 is expected to pick cudnn: the test prints it, the GPU check records it).
TEST_F(AttentionBackendTest, CudaEveryKernelRunsTheGpt350mAttentionOrIsRefusedByName) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "GPU-only: no CUDA device visible (runs in ctest -L gpu on the GPU machine)";
  AttentionShape s;
  s.num_heads = 16, s.sequence_length = 1024, s.head_dim = 64, s.causal = true;
  const c10::Device cuda(c10::kCUDA, 0);
  const std::string automatic = select_attention_backend("auto", s, cuda, at::kBFloat16);
  std::cout << "model.attention=auto on this GPU picks " << automatic << "\n";
  EXPECT_THAT(automatic, AnyOf("flash", "efficient", "cudnn", "math"));
  int runnable = 0;
  for (const char* name : {"flash", "efficient", "cudnn", "math"}) {
    try {
      EXPECT_EQ(select_attention_backend(name, s, cuda, at::kBFloat16), name);
    } catch (const ConfigError& e) {
      EXPECT_THAT(e.what(), HasSubstr(std::string("model.attention=") + name));
      continue;
    }
    ++runnable;
    const auto options = at::TensorOptions().device(cuda).dtype(at::kBFloat16);
    const at::Tensor q = at::randn({2, 16, 1024, 64}, options).requires_grad_(true);
    const at::Tensor y = at::scaled_dot_product_attention(q, q.detach().clone(), q.detach().clone(), std::nullopt, 0.0, true);
    y.sum().backward();
    EXPECT_TRUE(q.grad().defined()) << name;
    EXPECT_TRUE(at::isfinite(q.grad()).all().item<bool>()) << name;
  }
  EXPECT_GE(runnable, 2) << "math and at least one fused kernel run bf16 attention on any GPU this project targets";
}

}  // namespace
}  // namespace gpipe
