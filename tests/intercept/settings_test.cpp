// Strict parsing of the shim's environment settings.
#include "settings.h"

#include <cstdlib>

#include <gtest/gtest.h>

namespace {

class SettingsFromEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) unsetenv(v);
  }
  void TearDown() override {
    for (const char* v : kVars) unsetenv(v);
  }
  static constexpr const char* kVars[] = {"USE_ORION_SCHEDULER", "ORION_POLICY",
                                          "ORION_POLICY_PARAMS", "ORION_LOG_LEVEL",
                                          "ORION_HP_PRIORITY", "ORION_BE_PRIORITY",
                                          "ORION_BE_MAX_WAIT_US", "ORION_PUMP_INTERVAL_US",
                                          "ORION_TRACE", "ORION_PROFILE_EXPORT"};
};

TEST_F(SettingsFromEnv, DefaultsArePassThrough) {
  std::string error;
  auto s = orion::settings_from_env(&error);
  ASSERT_TRUE(s.has_value()) << error;
  EXPECT_FALSE(s->enabled);
  EXPECT_EQ(s->policy, "orion");
  EXPECT_EQ(s->hp_priority_max, -1);
  EXPECT_EQ(s->be_priority_min, 0);
}

TEST_F(SettingsFromEnv, ReadsEveryVariable) {
  setenv("USE_ORION_SCHEDULER", "1", 1);
  setenv("ORION_POLICY", "priority", 1);
  setenv("ORION_POLICY_PARAMS", "a=1,b=x", 1);
  setenv("ORION_LOG_LEVEL", "debug", 1);
  setenv("ORION_HP_PRIORITY", "-3", 1);
  setenv("ORION_BE_PRIORITY", "-1", 1);
  setenv("ORION_BE_MAX_WAIT_US", "500", 1);
  std::string error;
  auto s = orion::settings_from_env(&error);
  ASSERT_TRUE(s.has_value()) << error;
  EXPECT_TRUE(s->enabled);
  EXPECT_EQ(s->policy, "priority");
  EXPECT_EQ(s->policy_params.at("a"), "1");
  EXPECT_EQ(s->policy_params.at("b"), "x");
  EXPECT_EQ(s->log_level, "debug");
  EXPECT_EQ(s->hp_priority_max, -3);
  EXPECT_EQ(s->be_priority_min, -1);
  EXPECT_EQ(s->be_max_wait_us, 500);
}

TEST_F(SettingsFromEnv, BadValuesNameTheVariableAndTheAllowedValues) {
  struct Case {
    const char* var;
    const char* value;
  };
  for (Case c : {Case{"USE_ORION_SCHEDULER", "yes"}, Case{"ORION_LOG_LEVEL", "loud"},
                 Case{"ORION_HP_PRIORITY", "high"}, Case{"ORION_BE_MAX_WAIT_US", "-5"},
                 Case{"ORION_POLICY_PARAMS", "a=1,b"}, Case{"ORION_PUMP_INTERVAL_US", "0"},
                 // A key given twice kept its last value, silently.
                 Case{"ORION_POLICY_PARAMS", "be_sm_frac=0.5,be_sm_frac=0.9"},
                 // Output paths are checked at start, not when the file is written at exit.
                 Case{"ORION_TRACE", "/nonexistent/trace.json"},
                 Case{"ORION_PROFILE_EXPORT", "/nonexistent/profiles.csv"}}) {
    SetUp();
    setenv(c.var, c.value, 1);
    std::string error;
    EXPECT_FALSE(orion::settings_from_env(&error).has_value()) << c.var << "=" << c.value;
    EXPECT_NE(error.find(c.var), std::string::npos) << error;
  }
}

TEST_F(SettingsFromEnv, HighPriorityBoundMustBeBelowBestEffortBound) {
  setenv("ORION_HP_PRIORITY", "0", 1);
  setenv("ORION_BE_PRIORITY", "0", 1);
  std::string error;
  EXPECT_FALSE(orion::settings_from_env(&error).has_value());
  EXPECT_NE(error.find("ORION_HP_PRIORITY"), std::string::npos);
}

TEST(ParseInt, IsStrict) {
  int64_t v = 0;
  EXPECT_TRUE(orion::parse_int("-12", -100, 100, &v));
  EXPECT_EQ(v, -12);
  EXPECT_FALSE(orion::parse_int("12abc", -100, 100, &v));
  EXPECT_FALSE(orion::parse_int("", -100, 100, &v));
  EXPECT_FALSE(orion::parse_int("101", -100, 100, &v));
  // strtoll took leading blanks and a plus sign.
  EXPECT_FALSE(orion::parse_int(" 20", -100, 100, &v));
  EXPECT_FALSE(orion::parse_int("+20", -100, 100, &v));
  EXPECT_FALSE(orion::parse_int("20 ", -100, 100, &v));
}

}  // namespace
