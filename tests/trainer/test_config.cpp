// PipelineConfig: YAML load, per-field and cross-field errors, overrides, round-trip.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "trainer/config/config.h"

namespace gpipe {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The config of the seed's README, verbatim (comments included).
constexpr const char* kSeedYaml = R"(model:
  name: gpt
  hidden_size: 512
  num_layers: 16
  num_heads: 16
  sequence_length: 128
  vocab_size: -1  # from the dataset

dataset:
  name: code_search_net
  batch_size: 4

training:
  learning_rate: 0.0001
  epochs: 2
  num_microbatches: 4
  profile_iteration: 100
  exit_after_profile: true

parallel:
  model_parallel_size: 4
  scheduler: async_threaded  # or naive
  use_orion_scheduler: false
)";

std::string load_error(const std::string& yaml) {
  try {
    PipelineConfig::from_yaml_string(yaml, "test.yaml").validate();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string override_error(const std::vector<std::string>& overrides) {
  try {
    PipelineConfig c;
    for (const auto& o : overrides) c.apply_override(o);
    c.validate();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Config, SeedExampleLoadsWithItsValues) {
  const PipelineConfig c = PipelineConfig::from_yaml_string(kSeedYaml, "seed.yaml");
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.model.hidden_size, 512);
  EXPECT_EQ(c.model.vocab_size, -1);
  EXPECT_EQ(c.dataset.name, "code_search_net");
  EXPECT_DOUBLE_EQ(c.training.learning_rate, 1e-4);
  EXPECT_TRUE(c.training.exit_after_profile);
  EXPECT_EQ(c.parallel.model_parallel_size, 4);
  EXPECT_EQ(c.parallel.scheduler, "async_threaded");
}

TEST(Config, EmptyDocumentGivesDefaults) {
  EXPECT_EQ(PipelineConfig::from_yaml_string(""), PipelineConfig{});
  EXPECT_NO_THROW(PipelineConfig{}.validate());
}

TEST(Config, YamlRoundTripsEveryField) {
  PipelineConfig c;
  c.model.name = "gpt";
  c.model.num_layers = 49;
  c.model.hidden_size = 96;
  c.model.num_heads = 4;
  c.model.dropout = 0.125;
  c.model.vocab_size = 50257;
  c.dataset.batch_size = 16;
  c.dataset.path = "data/my corpus: v2.jsonl";  // needs quoting in YAML
  c.dataset.tokenizer = "sentencepiece";
  c.dataset.tokenizer_model = "tok.model";
  c.training.learning_rate = 3e-4;
  c.training.min_lr_ratio = 0.1;
  c.training.seed = 18446744073709551615ull;  // the largest uint64
  c.training.num_microbatches = 8;
  c.training.exit_after_profile = false;
  c.parallel.schedule = "zb_h1";
  c.parallel.partition = "explicit";
  c.parallel.partition_layers = {12, 13, 13, 11};
  c.parallel.recompute_ratio = {0.0, 0.5, 0.25, 1.0};
  c.model.dropout = 0;  // recomputation with dropout is refused (RecomputationWithDropoutIsRefused)
  ASSERT_NO_THROW(c.validate());
  c.model.dropout = 0.125;  // not validated again: the round trip keeps the value
  const std::string yaml = c.to_yaml();
  const PipelineConfig back = PipelineConfig::from_yaml_string(yaml);
  EXPECT_EQ(back, c) << yaml;
  EXPECT_EQ(back.to_yaml(), yaml);
}

TEST(Config, UnknownKeysAreErrorsWithSuggestions) {
  EXPECT_THAT(load_error("training:\n  learnig_rate: 0.1\n"),
              AllOf(HasSubstr("test.yaml:2:3"), HasSubstr("training.learnig_rate"), HasSubstr("did you mean 'training.learning_rate'")));
  EXPECT_THAT(load_error("trainng:\n  epochs: 1\n"), AllOf(HasSubstr("unknown section 'trainng'"), HasSubstr("'training'")));
  // A field of another section: point to where it lives.
  EXPECT_THAT(load_error("training:\n  batch_size: 8\n"), HasSubstr("did you mean 'dataset.batch_size'"));
  // Nothing close: list what exists.
  EXPECT_THAT(load_error("model:\n  zzzzzzzz: 1\n"), AllOf(HasSubstr("model.zzzzzzzz"), HasSubstr("model.hidden_size")));
}

// The seed's list form of partition and partition_layers in one file: refused, in either order
// (whichever came last used to win silently).
TEST(Config, TwoPartitionsInOneFileAreRefused) {
  for (const char* text : {"parallel:\n  partition: [2, 2]\n  partition_layers: [3, 1]\n",
                           "parallel:\n  partition_layers: [3, 1]\n  partition: [2, 2]\n"}) {
    EXPECT_THAT(load_error(text), HasSubstr("parallel.partition (a list) and parallel.partition_layers both give the "
                                            "partition")) << text;
  }
  EXPECT_EQ(PipelineConfig::from_yaml_string("parallel:\n  partition: explicit\n  partition_layers: [3, 1]\n")
                .parallel.partition_layers,
            (std::vector<int64_t>{3, 1}));
}

TEST(Config, BadTypesNameKeyLineAndValue) {
  EXPECT_THAT(load_error("model:\n  name: gpt\n  num_layers: 3.5\n"),
              AllOf(HasSubstr("test.yaml:3:15"), HasSubstr("model.num_layers"), HasSubstr("expected an integer"), HasSubstr("'3.5'")));
  EXPECT_THAT(load_error("training:\n  learning_rate: fast\n"), AllOf(HasSubstr("training.learning_rate"), HasSubstr("a number")));
  EXPECT_THAT(load_error("training:\n  exit_after_profile: maybe\n"), HasSubstr("true or false"));
  EXPECT_THAT(load_error("training:\n  seed: -3\n"), HasSubstr("training.seed"));
  EXPECT_THAT(load_error("parallel:\n  partition_layers: 12\n"), HasSubstr("a list of integers"));
  // A list names the entry that is not what the field holds.
  EXPECT_THAT(load_error("parallel:\n  partition_layers: [2, x, 2]\n"),
              AllOf(HasSubstr("parallel.partition_layers: expected a list of integers"), HasSubstr("entry 2 is 'x'")));
  EXPECT_THAT(load_error("parallel:\n  recompute_ratio: [0.5, [1]]\n"), HasSubstr("entry 2 is a list"));
  EXPECT_THAT(load_error("parallel:\n  partition: [2, 2.5, 2, 2]\n"),
              AllOf(HasSubstr("parallel.partition: expected uniform, explicit, parameters, time, or a list of integers"),
                    HasSubstr("entry 2 is '2.5'")));
  EXPECT_THAT(load_error("model: 7\n"), HasSubstr("model: expected a map"));
  EXPECT_THAT(load_error("[1, 2]\n"), HasSubstr("expected a map with sections"));
  EXPECT_THAT(load_error("model: {name: gpt\n"), AllOf(HasSubstr("test.yaml:"), HasSubstr("not valid YAML")));
  EXPECT_THAT(load_error("model:\n  num_layers: 8\n  num_layers: 9\n"),
              AllOf(HasSubstr("test.yaml:3:3"), HasSubstr("duplicate key 'model.num_layers'")));
  EXPECT_THAT(load_error("model: {}\nmodel: {}\n"), HasSubstr("duplicate key 'model'"));
  EXPECT_THAT(load_error("model:\n  [a]: 1\n"), HasSubstr("keys must be plain names"));
}

// A second YAML document ('---') was dropped unread: its settings never applied, nothing said so.
TEST(Config, ASecondYamlDocumentIsRefused) {
  EXPECT_THAT(load_error("training:\n  max_steps: 3\n---\nparallel:\n  model_parallel_size: 99\n"),
              AllOf(HasSubstr("test.yaml"), HasSubstr("one YAML document")));
}

// dataset.tokenizer_model with the byte tokenizer was ignored: a forgotten 'tokenizer:
// sentencepiece' trained on bytes.
TEST(Config, ATokenizerModelNeedsTheSentencePieceTokenizer) {
  EXPECT_THAT(override_error({"dataset.tokenizer_model=code_bpe.model"}),
              AllOf(HasSubstr("dataset.tokenizer_model"), HasSubstr("sentencepiece")));
}

TEST(Config, MissingFileNamesThePath) {
  const std::string path = "/nonexistent/dir/gpt_small.yaml";
  try {
    PipelineConfig::from_yaml_file(path);
    FAIL() << "no error for a missing file";
  } catch (const ConfigError& e) {
    EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr(path), HasSubstr("cannot read")));
  }
}

TEST(Config, LoadsFromFile) {
  const auto path = std::filesystem::temp_directory_path() / ("ourgpipe_config_test_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(path) << kSeedYaml;
  const PipelineConfig c = PipelineConfig::from_yaml_file(path.string());
  std::filesystem::remove(path);
  EXPECT_EQ(c.training.num_microbatches, 4);
}

// A file path under the temp folder holding `text`, removed at scope exit.
struct TempFile {
  explicit TempFile(const std::string& name, const std::string& text)
      : path((std::filesystem::temp_directory_path() / ("ourgpipe_" + std::to_string(::getpid()) + "_" + name)).string()) {
    std::ofstream(path) << text;
  }
  ~TempFile() { std::filesystem::remove(path); }
  std::string path;
};

std::string file_error(const std::string& text) {
  TempFile f("config.yaml", text);
  try {
    PipelineConfig::from_yaml_file(f.path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Config, AnEmptyOrSectionlessFileIsAnErrorNamingIt) {
  for (const char* text : {"", "# only a comment\n", "{}\n"}) {
    const std::string error = file_error(text);
    EXPECT_THAT(error, AllOf(HasSubstr("ourgpipe_"), HasSubstr("config.yaml"), HasSubstr("is empty"),
                             HasSubstr("model, dataset, training, parallel")))
        << "for the file text '" << text << "'";
  }
  EXPECT_EQ(file_error("training:\n  max_steps: 3\n"), "(no error)");
}

TEST(Config, PartitionTakesTheSeedsListForm) {
  const PipelineConfig c = PipelineConfig::from_yaml_string("parallel:\n  partition: [3, 2, 2, 1]\nmodel:\n  num_layers: 8\n");
  EXPECT_EQ(c.parallel.partition, "explicit");
  EXPECT_EQ(c.parallel.partition_layers, (std::vector<int64_t>{3, 2, 2, 1}));
  EXPECT_NO_THROW(c.validate());
  PipelineConfig o;
  o.apply_override("model.num_layers=8");
  o.apply_override("parallel.partition=[1,3,3,1]");
  EXPECT_EQ(o.parallel.partition, "explicit");
  EXPECT_EQ(o.parallel.partition_layers, (std::vector<int64_t>{1, 3, 3, 1}));
  EXPECT_NO_THROW(o.validate());
  // A name still works, and a list of non-integers says what a list must hold.
  o.apply_override("parallel.partition=uniform");
  EXPECT_EQ(o.parallel.partition, "uniform");
  try {
    PipelineConfig::from_yaml_string("parallel:\n  partition: [a, b]\n", "p.yaml");
    FAIL() << "a list of names was taken";
  } catch (const ConfigError& e) {
    EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr("p.yaml"), HasSubstr("parallel.partition")));
  }
}

TEST(Config, PartitionFileIsVPipesJson) {
  TempFile json("partition.json", R"({"partition": [3, 2, 2, 1], "recompute_ratio": [0.5, 0, 0, 0]})");
  PipelineConfig c;
  c.model.num_layers = 8;
  c.parallel.partition_file = json.path;
  c.load_partition_file();
  EXPECT_EQ(c.parallel.partition, "explicit");
  EXPECT_EQ(c.parallel.partition_layers, (std::vector<int64_t>{3, 2, 2, 1}));
  EXPECT_EQ(c.parallel.recompute_ratio, (std::vector<double>{0.5, 0, 0, 0}));
  EXPECT_TRUE(c.parallel.partition_file.empty()) << "folded in: print-config and checkpoints see the layers";
  EXPECT_NO_THROW(c.validate());

  auto error = [](const std::string& text, const std::string& overrides = "") {
    TempFile f("bad_partition.json", text);
    PipelineConfig c;
    c.model.num_layers = 8;
    if (!overrides.empty()) c.apply_override(overrides);
    c.parallel.partition_file = f.path;
    try {
      c.load_partition_file();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_THAT(error("{\"partition\": [3, 2"), AllOf(HasSubstr("bad_partition.json"), HasSubstr("not valid JSON")));
  EXPECT_THAT(error("{\"layers\": [8]}"), HasSubstr("no \"partition\" list"));
  EXPECT_THAT(error("{\"partition\": [8], \"ratio\": [1]}"), HasSubstr("unknown key \"ratio\""));
  EXPECT_THAT(error("{\"partition\": [4, 0, 4]}"), HasSubstr("an integer >= 1"));
  EXPECT_THAT(error("{\"partition\": [8], \"recompute_ratio\": [2]}"), HasSubstr("in [0, 1]"));
  EXPECT_THAT(error("{\"partition\": [4, 4]}", "parallel.partition_layers=[4,4]"), HasSubstr("keep one"));
  // A partition method asked for as well (--partition time) was overridden by the file, silently;
  // an empty list failed later naming parallel.partition_layers, not the file.
  EXPECT_THAT(error("{\"partition\": [4, 4]}", "parallel.partition=time"),
              AllOf(HasSubstr("parallel.partition is time"), HasSubstr("keep one")));
  EXPECT_THAT(error("{\"partition\": []}"), AllOf(HasSubstr("bad_partition.json"), HasSubstr("empty")));
  PipelineConfig missing;
  missing.parallel.partition_file = "/no/such/partition.json";
  try {
    missing.load_partition_file();
    FAIL() << "a missing partition file was taken";
  } catch (const ConfigError& e) {
    EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr("/no/such/partition.json"), HasSubstr("cannot read")));
  }
}

struct BadCase {
  std::vector<std::string> overrides;
  std::vector<std::string> expected;  // substrings of the error
};

class ImpossibleConfig : public ::testing::TestWithParam<BadCase> {};

TEST_P(ImpossibleConfig, GivesItsNamedError) {
  const std::string error = override_error(GetParam().overrides);
  for (const std::string& s : GetParam().expected) EXPECT_THAT(error, HasSubstr(s));
}

INSTANTIATE_TEST_SUITE_P(
    Config, ImpossibleConfig,
    ::testing::Values(
        BadCase{{"parallel.model_parallel_size=8", "model.num_layers=6"}, {"8 stages", "model.num_layers is 6"}},
        BadCase{{"parallel.schedule=interleaved_1f1b", "parallel.virtual_stages=5", "model.num_layers=16"},
                {"20 stages", "virtual_stages 5"}},
        BadCase{{"dataset.batch_size=6", "training.num_microbatches=4"}, {"training.num_microbatches 4", "does not divide", "batch_size 6"}},
        BadCase{{"dataset.batch_size=2", "training.num_microbatches=4"}, {"larger than dataset.batch_size"}},
        BadCase{{"model.hidden_size=100", "model.num_heads=16"}, {"model.hidden_size 100", "model.num_heads 16"}},
        BadCase{{"parallel.partition=explicit", "parallel.partition_layers=[4,4,8]"}, {"3 entries", "4 stages"}},
        BadCase{{"parallel.partition=explicit", "parallel.partition_layers=[4,4,4,5]"}, {"sums to 17", "num_layers is 16"}},
        BadCase{{"parallel.partition=explicit"}, {"partition_layers is empty"}},
        BadCase{{"parallel.partition_layers=[4,4,4,4]"}, {"partition is uniform", "partition: explicit"}},
        BadCase{{"parallel.partition_layers=[4,0,8,4]"}, {"parallel.partition_layers", "each >= 1"}},
        BadCase{{"parallel.recompute_ratio=[0.5,0.5]"}, {"recompute_ratio has 2 entries", "4 stages", "one per rank"}},
        BadCase{{"parallel.recompute_ratio=[0,0.5,1.5,0]"}, {"parallel.recompute_ratio", "[0, 1]"}},
        BadCase{{"parallel.schedule=2f2b"}, {"parallel.schedule", "'2f2b'", "gpipe, 1f1b, interleaved_1f1b, zb_h1"}},
        BadCase{{"parallel.scheduler=fast"}, {"parallel.scheduler", "naive, async_threaded"}},
        BadCase{{"parallel.priority=high"}, {"parallel.priority", "backward_first"}},
        BadCase{{"parallel.streams=per_stage"}, {"parallel.streams", "per_microbatch, per_rank"}},
        BadCase{{"parallel.device=tpu"}, {"parallel.device", "auto, cpu, cuda"}},
        BadCase{{"parallel.partition=random"}, {"parallel.partition", "uniform, explicit, parameters, time"}},
        BadCase{{"parallel.schedule=interleaved_1f1b", "parallel.virtual_stages=2", "training.num_microbatches=9",
                 "dataset.batch_size=18"},
                {"training.num_microbatches (9)", "2 equal rounds", "at most 7", "multiple of parallel.model_parallel_size"}},
        BadCase{{"parallel.schedule=interleaved_zb", "parallel.virtual_stages=2", "training.num_microbatches=9",
                 "dataset.batch_size=18"},
                {"interleaved_zb", "2 equal rounds"}},
        BadCase{{"parallel.schedule=zbv", "parallel.virtual_stages=3", "model.num_layers=12"},
                {"zbv needs parallel.virtual_stages: 2", "got 3", "V placement"}},
        BadCase{{"parallel.schedule=dualpipev"}, {"dualpipev needs parallel.virtual_stages: 2", "got 1"}},
        BadCase{{"parallel.schedule=dualpipev", "parallel.virtual_stages=2", "training.num_microbatches=4",
                 "dataset.batch_size=8"},
                {"dualpipev needs training.num_microbatches (4) >= the stage count", "(8)"}},
        BadCase{{"parallel.schedule=zb_h1", "parallel.virtual_stages=2"}, {"virtual_stages is 2", "zb_h1"}},
        BadCase{{"parallel.data_parallel_size=3"}, {"training.num_microbatches 4", "does not split over", "3 replicas"}},
        BadCase{{"parallel.data_parallel_size=2", "parallel.sync_mode=asp"},
                {"sync_mode is asp with parallel.data_parallel_size 2", "use sync_mode: bsp"}},
        BadCase{{"parallel.data_parallel_size=2", "parallel.schedule=dualpipev", "parallel.virtual_stages=2",
                 "training.num_microbatches=8", "dataset.batch_size=8"},
                {"dualpipev needs training.num_microbatches / parallel.data_parallel_size (4)"}},
        BadCase{{"parallel.data_parallel_size=0"}, {"parallel.data_parallel_size", "an integer >= 1"}},
        BadCase{{"parallel.dp_bucket_mb=0"}, {"parallel.dp_bucket_mb", "a number of MiB > 0"}},
        BadCase{{"parallel.peer_timeout_s=1e300"}, {"parallel.peer_timeout_s", "0.001 to 31536000"}},
        BadCase{{"parallel.peer_timeout_s=0.0001"}, {"parallel.peer_timeout_s", "0.001 to 31536000"}},
        BadCase{{"parallel.asp_window_steps=0"}, {"asp_window_steps is 0 but parallel.sync_mode is bsp",
                                                   "only asp runs steps without draining"}},
        BadCase{{"parallel.asp_window_steps=-1"}, {"parallel.asp_window_steps", "an integer >= 0"}},
        BadCase{{"dataset.tokenizer=sentencepiece"}, {"tokenizer_model is empty"}},
        BadCase{{"parallel.use_orion_scheduler=true", "parallel.device=cpu"}, {"use_orion_scheduler", "cpu"}},
        BadCase{{"training.learning_rate=0"}, {"training.learning_rate", "> 0"}},
        BadCase{{"model.dropout=1"}, {"model.dropout", "[0, 1)"}},
        BadCase{{"training.max_steps=0"}, {"training.max_steps"}},
        BadCase{{"model.vocab_size=0"}, {"model.vocab_size", "-1"}},
        BadCase{{"training.dtype=fp16"}, {"training.dtype", "auto, fp32, bf16"}}));

TEST(Config, OverridesSetScalarsListsAndStrings) {
  PipelineConfig c;
  c.apply_override("training.learning_rate=3e-4");
  EXPECT_DOUBLE_EQ(c.training.learning_rate, 3e-4);
  c.apply_override("parallel.partition=explicit");
  c.apply_override("parallel.partition_layers=[3,5,5,3]");
  EXPECT_EQ(c.parallel.partition_layers, (std::vector<int64_t>{3, 5, 5, 3}));
  c.apply_override("training.output_dir=runs/a: b #1");  // strings verbatim
  EXPECT_EQ(c.training.output_dir, "runs/a: b #1");
  c.apply_override("training.exit_after_profile=false");
  EXPECT_FALSE(c.training.exit_after_profile);
  c.apply_override("parallel.partition_layers=[]");
  EXPECT_TRUE(c.parallel.partition_layers.empty());
  EXPECT_NO_THROW(c.apply_override("parallel.partition=uniform"));
  EXPECT_NO_THROW(c.validate());
}

TEST(Config, MultiStageSchedulesWithTheStagesPerRankTheyNeed) {
  // 4 ranks, 8 micro-batches (batch 8): each name with the virtual stages it needs validates.
  for (const auto& [schedule, v] : std::vector<std::pair<std::string, int>>{
           {"interleaved_1f1b", 2}, {"interleaved_zb", 3}, {"looped_bfs", 2}, {"zbv", 2}, {"dualpipev", 2}}) {
    PipelineConfig c;
    c.apply_override("parallel.schedule=" + schedule);
    c.apply_override("parallel.virtual_stages=" + std::to_string(v));
    c.apply_override("training.num_microbatches=8");
    c.apply_override("dataset.batch_size=8");
    EXPECT_NO_THROW(c.validate()) << schedule;
  }
  PipelineConfig c;  // torch's flex rounds: 5 micro-batches on 4 ranks is one round
  c.apply_override("parallel.schedule=interleaved_1f1b");
  c.apply_override("parallel.virtual_stages=2");
  c.apply_override("training.num_microbatches=5");
  c.apply_override("dataset.batch_size=5");
  EXPECT_NO_THROW(c.validate());
}

TEST(Config, MalformedOverridesAreErrors) {
  EXPECT_THAT(override_error({"learning_rate=1"}), HasSubstr("expected section.field=value"));
  EXPECT_THAT(override_error({"training.learning_rate"}), HasSubstr("expected section.field=value"));
  EXPECT_THAT(override_error({"training.lr=1"}), AllOf(HasSubstr("unknown key 'training.lr'"), HasSubstr("training.learning_rate")));
  EXPECT_THAT(override_error({"trianing.epochs=1"}), HasSubstr("did you mean 'training'"));
  EXPECT_THAT(override_error({"training.epochs="}), HasSubstr("needs a value"));
  EXPECT_THAT(override_error({"training.epochs=two"}), AllOf(HasSubstr("training.epochs"), HasSubstr("'two'")));
  EXPECT_THAT(override_error({"parallel.partition_layers=[1,2"}), HasSubstr("not valid YAML"));
}

TEST(Config, RecomputeRatioIsOneForAllPerRankOrPerStage) {
  for (const char* ok : {"[0.5]", "[0,0.25,0.5,1]", "[0,0,0,0,1,1,1,1]"}) {
    PipelineConfig c;
    c.apply_override("parallel.schedule=interleaved_1f1b");
    c.apply_override("parallel.virtual_stages=2");
    c.apply_override(std::string("parallel.recompute_ratio=") + ok);
    EXPECT_NO_THROW(c.validate()) << ok;
  }
}

// Recomputation replays no random state, so with dropout its gradients would belong to other
// masks: refused, naming both fields.
TEST(Config, RecomputationWithDropoutIsRefused) {
  PipelineConfig c;
  c.apply_override("parallel.recompute_ratio=[0.5]");
  EXPECT_NO_THROW(c.validate());
  c.apply_override("model.dropout=0.1");
  try {
    c.validate();
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("parallel.recompute_ratio"), HasSubstr("model.dropout is 0.1"),
                                HasSubstr("new dropout masks")));
  }
  c.apply_override("parallel.recompute_ratio=[0]");
  EXPECT_NO_THROW(c.validate());
}

// asp windows of several steps run steps x micro-batches in one schedule: interleaved schedules
// need that to split into whole rounds for every window length, and a file cannot give it.
TEST(Config, AspWindowsNeedShapesEveryWindowLengthCanRun) {
  PipelineConfig c;
  c.apply_override("parallel.schedule=interleaved_1f1b");
  c.apply_override("parallel.virtual_stages=2");
  c.apply_override("parallel.sync_mode=asp");
  c.apply_override("training.num_microbatches=7");
  c.apply_override("dataset.batch_size=14");
  EXPECT_NO_THROW(c.validate());  // one step per window: 7 micro-batches split into one round
  c.apply_override("parallel.asp_window_steps=2");
  try {
    c.validate();
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("asp_window_steps 2"), HasSubstr("multiple of parallel.model_parallel_size")));
  }
  c.apply_override("training.num_microbatches=8");
  c.apply_override("dataset.batch_size=16");
  EXPECT_NO_THROW(c.validate());
  c.apply_override("parallel.schedule_file=some.csv");
  try {
    c.validate();
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("only a generated schedule"));
  }
}

// Two nodes without a shared filesystem can hold different files under one path: the ranks'
// fingerprint covers what the named files say, not only their paths.
TEST(Config, RunFingerprintCoversTheScheduleAndTokenizerFilesContents) {
  PipelineConfig c;
  const std::string bare = run_fingerprint_text(c);
  EXPECT_EQ(bare, c.to_yaml());  // nothing named: the YAML alone
  TempFile schedule("schedule.csv", "0F0,0B0\n");
  c.parallel.schedule_file = schedule.path;
  const std::string first = run_fingerprint_text(c);
  EXPECT_NE(first.find("0F0,0B0"), std::string::npos);
  std::ofstream(schedule.path) << "0B0,0F0\n";  // same path, another node's file
  EXPECT_NE(run_fingerprint_text(c), first);
  TempFile model("tok.model", "spm-bytes-a");
  c.dataset.tokenizer_model = model.path;
  const std::string with_model = run_fingerprint_text(c);
  std::ofstream(model.path) << "spm-bytes-b";
  EXPECT_NE(run_fingerprint_text(c), with_model);
  c.parallel.schedule_file = schedule.path + ".missing";  // unreadable: its path still counts
  EXPECT_NE(run_fingerprint_text(c).find(".missing"), std::string::npos);
}

TEST(Config, ValidateCatchesValuesSetInCode) {
  PipelineConfig c;
  c.parallel.schedule = "dualpipev";  // needs virtual_stages 2
  EXPECT_THROW(c.validate(), ConfigError);
  c = PipelineConfig{};
  c.training.num_microbatches = 0;
  EXPECT_THROW(c.validate(), ConfigError);
  // A CUDA-only attention kernel on a CPU run is refused before anything runs.
  c = PipelineConfig{};
  c.parallel.device = "cpu";
  c.model.attention = "cudnn";
  try {
    c.validate();
    ADD_FAILURE() << "cudnn attention on cpu was accepted";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.attention=cudnn is a CUDA kernel and parallel.device is cpu"));
  }
  c.parallel.device = "auto";  // may be a GPU: the run decides
  EXPECT_NO_THROW(c.validate());
}

}  // namespace
}  // namespace gpipe
