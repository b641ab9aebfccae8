// ProfileStore: SM-need cache, online duration learning, Orion CSV import/export and its errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "fake_device.h"
#include "scheduler/profile_store.h"

namespace sched {
namespace {

using testing::FakeDevice;

KernelInfo shape(KernelId id, uint32_t blocks, uint32_t block_x, const char* name = nullptr) {
  KernelInfo k;
  k.id = id;
  k.name = name;
  k.grid.x = blocks;
  k.block.x = block_x;
  return k;
}

TEST(ProfileStore, SmNeedAskedOncePerShape) {
  FakeDevice dev(/*sm_count=*/50, /*blocks_per_sm=*/4);
  ProfileStore store;
  EXPECT_EQ(store.estimate(shape(1, 40, 128), dev).sms_needed, 10);
  EXPECT_EQ(store.estimate(shape(1, 400, 128), dev).sms_needed, 50);  // same shape, new grid
  EXPECT_EQ(dev.occupancy_queries(), 1);
  store.estimate(shape(1, 40, 256), dev);  // new block size
  KernelInfo smem = shape(1, 40, 128);
  smem.shared_mem_bytes = 1024;
  store.estimate(smem, dev);
  store.estimate(shape(2, 40, 128), dev);  // new kernel
  EXPECT_EQ(dev.occupancy_queries(), 4);
  store.estimate(smem, dev);
  EXPECT_EQ(dev.occupancy_queries(), 4);
}

// A device that cannot tell a shape's occupancy now (the shim's helper thread has no context) is
// asked again next time: its non-answer is neither kept nor taken for one block per SM forever.
TEST(ProfileStore, AnOccupancyTheDeviceCannotTellIsAskedAgain) {
  FakeDevice dev(/*sm_count=*/50, /*blocks_per_sm=*/4);
  dev.occupancy_unknown_answers = 1;
  ProfileStore store;
  EXPECT_EQ(store.estimate(shape(1, 40, 128), dev).sms_needed, 40) << "unknown: one block per SM, for now";
  EXPECT_EQ(store.estimate(shape(1, 40, 128), dev).sms_needed, 10) << "asked again: 4 blocks per SM";
  EXPECT_EQ(dev.occupancy_queries(), 2);
  store.estimate(shape(1, 40, 128), dev);
  EXPECT_EQ(dev.occupancy_queries(), 2) << "a known answer is kept";
}

// Review regression: an empty (non-null) kernel name used to make every estimate take the
// exclusive lock and ask the device for occupancy again.
TEST(ProfileStore, EmptyNameDoesNotDefeatTheShapeCache) {
  FakeDevice dev(/*sm_count=*/50, /*blocks_per_sm=*/4);
  ProfileStore store;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(store.estimate(shape(9, 40, 128, ""), dev).sms_needed, 10);
  EXPECT_EQ(dev.occupancy_queries(), 1);
  // A real name arriving later is still taken.
  store.estimate(shape(9, 40, 128, "gemm"), dev);
  EXPECT_EQ(store.find(9)->name, "gemm");
}

TEST(ProfileStore, LearnsDurationAsEwma) {
  FakeDevice dev;
  ProfileStore store(/*ewma_alpha=*/0.5);
  EXPECT_EQ(store.estimate(shape(3, 1, 32), dev).duration_ns, 0);
  store.record_completion(3, 1000, 3000);  // first sample: 2000
  EXPECT_DOUBLE_EQ(store.estimate(shape(3, 1, 32), dev).duration_ns, 2000);
  store.record_completion(3, 0, 4000);     // 2000 + 0.5 * (4000 - 2000)
  EXPECT_DOUBLE_EQ(store.estimate(shape(3, 1, 32), dev).duration_ns, 3000);
  store.record_completion(3, 10, 10);      // untimed: ignored
  EXPECT_EQ(store.find(3)->samples, 2u);
  EXPECT_THROW(ProfileStore(0.0), std::invalid_argument);
}

TEST(ProfileStore, HintWinsOverStoredProfile) {
  FakeDevice dev;
  ProfileStore store;
  store.set_profile(4, KernelProfile::kComputeBound);
  EXPECT_EQ(store.estimate(shape(4, 1, 32), dev).profile, KernelProfile::kComputeBound);
  KernelInfo k = shape(4, 1, 32);
  k.profile_hint = KernelProfile::kMemoryBound;
  EXPECT_EQ(store.estimate(k, dev).profile, KernelProfile::kMemoryBound);
  EXPECT_EQ(store.profile_of(4), KernelProfile::kComputeBound);
  EXPECT_EQ(store.profile_of(99), KernelProfile::kUnknown);
}

const char* kCsv =
    "Name,Profile,Memory_footprint,SM_usage,Duration\n"
    "volta_sgemm_128x64_nn,1,0,80,41000\n"
    "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>(int),0,4096,20,3500.5\n"
    "\"quoted, name \"\"x\"\"\",-1,0,1,7\n";

// Issue 11: a CUfunction address reused by another kernel after its module was unloaded (NVRTC,
// cuDNN runtime-compiled engines, Triton) must not inherit the old kernel's learned duration,
// profile or SMs per launch shape.
TEST(ProfileStore, AHandleRegisteredUnderAnotherNameStartsAfresh) {
  FakeDevice dev(/*sm_count=*/50, /*blocks_per_sm=*/4);
  ProfileStore store(/*ewma_alpha=*/1.0);
  std::istringstream in("Name,Profile,Memory_footprint,SM_usage,Duration\nnew_kernel,0,0,7,900\n");
  store.import_orion_csv(in, "t.csv");
  const char* old_name = store.register_kernel(5, "old_kernel");
  store.set_profile(5, KernelProfile::kComputeBound);
  EXPECT_EQ(store.estimate(shape(5, 8, 128), dev).sms_needed, 2);
  store.record_completion(5, 0, 50'000);
  ASSERT_DOUBLE_EQ(store.find(5)->duration_ns, 50'000);
  EXPECT_EQ(store.register_kernel(5, "old_kernel"), old_name) << "the same kernel again keeps what was learned";
  EXPECT_DOUBLE_EQ(store.find(5)->duration_ns, 50'000);

  const int occupancy_queries = dev.occupancy_queries();
  const char* new_name = store.register_kernel(5, "new_kernel");
  ASSERT_NE(new_name, nullptr);
  EXPECT_STREQ(new_name, "new_kernel");
  EXPECT_STREQ(old_name, "old_kernel") << "a name handed out earlier stays valid";
  const auto e = store.find(5);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->samples, 0u);
  EXPECT_DOUBLE_EQ(e->duration_ns, 900) << "the new kernel's imported row, not the old kernel's learned time";
  EXPECT_EQ(e->profile, KernelProfile::kMemoryBound);
  store.estimate(shape(5, 8, 128), dev);
  EXPECT_EQ(dev.occupancy_queries(), occupancy_queries + 1) << "SMs per shape asked again for the new kernel";
  EXPECT_EQ(store.size(), 1u);
}

TEST(ProfileStore, ImportMatchesByNameOnFirstSight) {
  FakeDevice dev;
  ProfileStore store;
  std::istringstream in(kCsv);
  EXPECT_EQ(store.import_orion_csv(in, "t.csv"), 3u);
  EXPECT_EQ(store.size(), 0u);  // nothing seen yet
  const char* name = store.register_kernel(77, "volta_sgemm_128x64_nn");
  ASSERT_NE(name, nullptr);
  EXPECT_STREQ(name, "volta_sgemm_128x64_nn");
  auto e = store.find(77);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->profile, KernelProfile::kComputeBound);
  EXPECT_DOUBLE_EQ(e->duration_ns, 41000);
  EXPECT_EQ(e->imported_sm_usage, 80);

  // A name first seen through estimate() (KernelInfo::name) matches too.
  const std::string add =
      "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>(int)";
  OpEstimate est = store.estimate(shape(78, 1, 32, add.c_str()), dev);
  EXPECT_EQ(est.profile, KernelProfile::kMemoryBound);
  EXPECT_DOUBLE_EQ(est.duration_ns, 3500.5);
  EXPECT_EQ(store.find(78)->memory_footprint, 4096u);
  store.register_kernel(79, "quoted, name \"x\"");
  EXPECT_DOUBLE_EQ(store.find(79)->duration_ns, 7);
  store.register_kernel(80, "never_imported");
  EXPECT_EQ(store.find(80)->profile, KernelProfile::kUnknown);
}

TEST(ProfileStore, CsvRoundTrip) {
  ProfileStore a;
  std::istringstream in(kCsv);
  a.import_orion_csv(in);
  a.register_kernel(1, "volta_sgemm_128x64_nn");
  a.record_completion(1, 0, 41000);  // first live sample replaces the import: same value
  a.register_kernel(2, "learned_only");
  a.set_profile(2, KernelProfile::kMemoryBound);
  a.record_completion(2, 0, 1234);
  std::ostringstream out;
  a.export_orion_csv(out);

  ProfileStore b;
  std::istringstream back(out.str());
  EXPECT_EQ(b.import_orion_csv(back), 4u) << out.str();
  std::ostringstream again;
  b.export_orion_csv(again);
  std::istringstream a_rows(out.str()), b_rows(again.str());
  std::multiset<std::string> rows_a, rows_b;
  for (std::string l; std::getline(a_rows, l);) rows_a.insert(l);
  for (std::string l; std::getline(b_rows, l);) rows_b.insert(l);
  EXPECT_EQ(rows_a, rows_b);
  b.register_kernel(5, "learned_only");
  EXPECT_EQ(b.find(5)->profile, KernelProfile::kMemoryBound);
  EXPECT_DOUBLE_EQ(b.find(5)->duration_ns, 1234);
}

void expect_csv_error(const std::string& text, const std::string& needle) {
  ProfileStore store;
  std::istringstream in(text);
  try {
    store.import_orion_csv(in, "prof.csv");
    ADD_FAILURE() << "no error for: " << text;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ProfileStore, BadCsvNamesLineAndField) {
  expect_csv_error("", "prof.csv: empty profile CSV");
  expect_csv_error("Name,Profile,Duration\nk,1,5\n", "prof.csv:1: expected the header");
  expect_csv_error("Name,Profile,Memory_footprint,SM_usage,Duration\nk,1,0,1,5\nk2,2,0,1,5\n",
                   "prof.csv:3: field 'Profile'");
  expect_csv_error("Name,Profile,Memory_footprint,SM_usage,Duration\nk,1,0,1,fast\n",
                   "prof.csv:2: field 'Duration': expected a number, got 'fast'");
  expect_csv_error("Name,Profile,Memory_footprint,SM_usage,Duration\nk,1,0,1.5,5\n",
                   "prof.csv:2: field 'SM_usage'");
  expect_csv_error("Name,Profile,Memory_footprint,SM_usage,Duration\nk,1,-4,1,5\n",
                   "prof.csv:2: field 'Memory_footprint'");
  // Infinite or absurd figures: a Duration of inf counted as outstanding best-effort work made
  // inf - inf = 0 of every other kernel's at its completion (and UB as gpud's int64).
  expect_csv_error("Name,Profile,Memory_footprint,SM_usage,Duration\nk,1,0,1,inf\n",
                   "prof.csv:2: field 'Duration': expected a finite number, got 'inf'");
  expect_csv_error("Name,Profile,Memory_footprint,SM_usage,Duration\nk,1,0,1,1e300\n",
                   "prof.csv:2: field 'Duration': must be at most");
  expect_csv_error("Name,Profile,Memory_footprint,SM_usage,Duration\nk,1,1e30,1,5\n",
                   "prof.csv:2: field 'Memory_footprint': must be at most");
  expect_csv_error("Name,Profile,Memory_footprint,SM_usage,Duration\nk,1,0,1e12,5\n",
                   "prof.csv:2: field 'SM_usage': must be at most");
  expect_csv_error("Name,Profile,Memory_footprint,SM_usage,Duration\n\nk,1,0\n",
                   "prof.csv:3: field 'Name': expected 5 comma-separated fields");
  expect_csv_error("Name,Profile,Memory_footprint,SM_usage,Duration\n\"k,1,0,1,5\n",
                   "prof.csv:2: field 'Name': unterminated");
  // A failed import leaves the store unchanged.
  ProfileStore store;
  std::istringstream in("Name,Profile,Memory_footprint,SM_usage,Duration\nok,1,0,1,5\nbad,1,0,1,x\n");
  EXPECT_THROW(store.import_orion_csv(in), std::invalid_argument);
  store.register_kernel(1, "ok");
  EXPECT_EQ(store.find(1)->profile, KernelProfile::kUnknown);
}

TEST(ProfileStore, FilesErrorsNameThePath) {
  ProfileStore store;
  try {
    store.load_orion_csv("/nonexistent/profiles.csv");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/profiles.csv"), std::string::npos);
  }
  EXPECT_NE(store.save_orion_csv("/nonexistent/dir/out.csv").find("/nonexistent/dir/out.csv"),
            std::string::npos);
  const std::string path = ::testing::TempDir() + "profile_store_test.csv";
  store.register_kernel(9, "k9");
  store.record_completion(9, 0, 500);
  ASSERT_EQ(store.save_orion_csv(path), "");
  ProfileStore loaded;
  EXPECT_EQ(loaded.load_orion_csv(path), 1u);
  loaded.register_kernel(10, "k9");
  EXPECT_DOUBLE_EQ(loaded.find(10)->duration_ns, 500);
  std::remove(path.c_str());
}

TEST(ProfileStore, ConcurrentLookupsAndLearning) {
  FakeDevice dev;
  ProfileStore store;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const KernelId id = static_cast<KernelId>(i % 16);
        store.estimate(shape(id, 8, 64 << (i % 3)), dev);
        store.record_completion(id, 0, 100 + t);
        if (i % 100 == 0) store.register_kernel(id, "k" + std::to_string(id));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(store.size(), 16u);
  EXPECT_EQ(dev.occupancy_queries() >= 48, true);  // 16 kernels x 3 shapes, races may ask twice
  uint64_t samples = 0;
  for (KernelId id = 0; id < 16; ++id) samples += store.find(id)->samples;
  EXPECT_EQ(samples, 8000u);
}

}  // namespace
}  // namespace sched
