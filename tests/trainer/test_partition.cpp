// partition_blocks(): uniform remainder placement, explicit checks, cost balancing (checked
// against brute force on small cases).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>

#include "trainer/config/config.h"
#include "trainer/partition/partition.h"

namespace gpipe {
namespace {

using V = std::vector<int64_t>;
using ::testing::HasSubstr;

std::vector<double> unit_costs(int blocks) {  // embedding and head free, blocks cost 1
  std::vector<double> c(blocks + 2, 1.0);
  c.front() = c.back() = 0.0;
  return c;
}

TEST(Partition, UniformSpreadsTheRemainderOverTheMiddleFirst) {
  EXPECT_EQ(partition_blocks("uniform", unit_costs(16), 4), (V{4, 4, 4, 4}));
  EXPECT_EQ(partition_blocks("uniform", unit_costs(49), 4), (V{12, 13, 12, 12}));
  EXPECT_EQ(partition_blocks("uniform", unit_costs(50), 4), (V{12, 13, 13, 12}));
  EXPECT_EQ(partition_blocks("uniform", unit_costs(51), 4), (V{13, 13, 13, 12}));  // then stage 0, last stage last
  EXPECT_EQ(partition_blocks("uniform", unit_costs(3), 2), (V{2, 1}));
  EXPECT_EQ(partition_blocks("uniform", unit_costs(7), 1), (V{7}));
  EXPECT_EQ(partition_blocks("uniform", unit_costs(5), 5), (V{1, 1, 1, 1, 1}));
}

TEST(Partition, ExplicitIsCheckedAndReturned) {
  EXPECT_EQ(partition_blocks("explicit", unit_costs(49), 4, {12, 13, 13, 11}), (V{12, 13, 13, 11}));
  try {
    partition_blocks("explicit", unit_costs(49), 4, {12, 13, 13, 12});
    FAIL() << "no error for a wrong sum";
  } catch (const ConfigError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("sums to 50"));
  }
  EXPECT_THROW(partition_blocks("explicit", unit_costs(49), 4, {25, 24}), ConfigError);
  EXPECT_THROW(partition_blocks("explicit", unit_costs(49), 4, {0, 13, 18, 18}), ConfigError);
  EXPECT_THROW(partition_blocks("explicit", unit_costs(49), 4, {}), ConfigError);
}

TEST(Partition, HeavyHeadGetsFewerBlocks) {
  std::vector<double> costs(10, 1.0);  // 8 blocks
  costs.front() = 0;
  costs.back() = 4;  // LM head costs 4 blocks
  for (const char* method : {"parameters", "time"}) {
    const V split = partition_blocks(method, costs, 4);
    EXPECT_EQ(std::accumulate(split.begin(), split.end(), int64_t{0}), 8);
    EXPECT_EQ(split.back(), 1) << method;
    const auto stage = stage_costs(costs, split);
    EXPECT_DOUBLE_EQ(*std::max_element(stage.begin(), stage.end()), 5.0);
  }
}

TEST(Partition, HeavyEmbeddingGetsFewerBlocks) {
  std::vector<double> costs = {3, 1, 1, 1, 1, 1, 1, 0};  // embedding costs 3 blocks
  const V split = partition_blocks("parameters", costs, 3);
  EXPECT_EQ(split.front(), 1);
  const auto stage = stage_costs(costs, split);
  EXPECT_DOUBLE_EQ(*std::max_element(stage.begin(), stage.end()), 4.0);
}

// Smallest max stage cost over every contiguous split (each stage >= 1 block).
double brute_force_best(const std::vector<double>& costs, int stages) {
  const int blocks = static_cast<int>(costs.size()) - 2;
  double best = 1e300;
  V split(stages, 1);
  std::function<void(int, int)> place = [&](int stage, int left) {
    if (stage == stages - 1) {
      split[stage] = left;
      const auto c = stage_costs(costs, split);
      best = std::min(best, *std::max_element(c.begin(), c.end()));
      return;
    }
    for (int n = 1; n <= left - (stages - 1 - stage); ++n) {
      split[stage] = n;
      place(stage + 1, left - n);
    }
  };
  place(0, blocks);
  return best;
}

TEST(Partition, BalancedSplitIsOptimalOnSmallCases) {
  uint64_t state = 12345;
  auto next = [&] {  // a fixed LCG: the cases are the same on every run
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>((state >> 33) % 100) / 10.0;
  };
  for (int blocks = 1; blocks <= 9; ++blocks) {
    for (int stages = 1; stages <= std::min(blocks, 4); ++stages) {
      for (int trial = 0; trial < 5; ++trial) {
        std::vector<double> costs(blocks + 2);
        for (double& c : costs) c = next();
        const V split = partition_blocks("time", costs, stages);
        ASSERT_EQ(static_cast<int>(split.size()), stages);
        EXPECT_TRUE(std::all_of(split.begin(), split.end(), [](int64_t n) { return n >= 1; }));
        const auto c = stage_costs(costs, split);
        EXPECT_DOUBLE_EQ(*std::max_element(c.begin(), c.end()), brute_force_best(costs, stages))
            << blocks << " blocks, " << stages << " stages";
      }
    }
  }
}

TEST(Partition, BadInputIsNamed) {
  EXPECT_THROW(partition_blocks("uniform", {1.0, 1.0}, 1), std::invalid_argument);  // no block
  EXPECT_THROW(partition_blocks("time", {0, -1, 0}, 1), std::invalid_argument);
  EXPECT_THROW(partition_blocks("time", {0, std::nan(""), 0}, 1), std::invalid_argument);
  EXPECT_THROW(partition_blocks("uniform", unit_costs(3), 0), std::invalid_argument);
  try {
    partition_blocks("uniform", unit_costs(3), 4);
    FAIL() << "no error for more stages than blocks";
  } catch (const ConfigError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("4 stages but only 3"));
  }
  try {
    partition_blocks("greedy", unit_costs(8), 2);
    FAIL() << "no error for an unknown method";
  } catch (const ConfigError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("uniform, explicit, parameters, time"));
  }
  EXPECT_THROW(stage_costs(unit_costs(4), {1, 1}), std::invalid_argument);
}

}  // namespace
}  // namespace gpipe
