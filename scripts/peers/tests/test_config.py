"""The peers' YAML config reader: defaults, overrides, and errors that name the key."""
import re
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from config import BYTE_VOCAB_SIZE, DEFAULTS, ConfigError, gpt_shape, load_config  # noqa: E402

CONFIG_H = Path(__file__).resolve().parents[3] / "trainer" / "config" / "include" / "trainer" / "config" / "config.h"


class ConfigTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.path = Path(self.tmp.name) / "c.yaml"

    def tearDown(self):
        self.tmp.cleanup()

    def load(self, text, overrides=()):
        self.path.write_text(text)
        return load_config(self.path, list(overrides))

    def test_defaults_and_overrides(self):
        cfg = self.load("model:\n  hidden_size: 64\n  num_heads: 4\n",
                        ["training.num_microbatches=2", "training.learning_rate=1"])
        s = gpt_shape(cfg)
        self.assertEqual((s.hidden_size, s.num_layers, s.ffn_hidden_size), (64, 16, 256))
        self.assertEqual(s.vocab_size, BYTE_VOCAB_SIZE)
        self.assertEqual(s.microbatch_size, 2)
        self.assertEqual(cfg["training"]["learning_rate"], 1.0)

    def test_keys_match_the_cpp_config(self):
        # The peers must accept exactly the YAML keys gpipe_runner accepts (config.h's fields).
        text = CONFIG_H.read_text()
        for struct, section in (("ModelConfig", "model"), ("SyntheticLayerConfig", "synthetic"),
                                ("DatasetConfig", "dataset"), ("TrainingConfig", "training"),
                                ("ParallelConfig", "parallel")):
            body = re.search(r"struct %s \{(.*?)\n\};" % struct, text, re.S).group(1)
            # Data members only: a line with parentheses is a function (e.g. operator==); a member
            # of a config struct type (ModelConfig::synthetic) is its own YAML section.
            fields = [m.group(1) for line in body.splitlines() if "(" not in line.split("//")[0]
                      for m in [re.match(r"\s+[\w:<>]+\s+(\w+)\s*(?:=[^;]*)?;", line)]
                      if m and not re.match(r"\s+SyntheticLayerConfig\s", line)]
            self.assertEqual(sorted(fields), sorted(DEFAULTS[section]), f"section {section}")

    def test_string_overrides_are_verbatim(self):
        cfg = self.load("{}", ["dataset.path=123", "parallel.schedule=1f1b"])
        self.assertEqual(cfg["dataset"]["path"], "123")
        self.assertEqual(cfg["parallel"]["schedule"], "1f1b")

    def test_errors_name_the_key(self):
        with self.assertRaisesRegex(ConfigError, "model.hidden_sise"):
            self.load("model:\n  hidden_sise: 64\n")
        with self.assertRaisesRegex(ConfigError, "training.exit_after_profile"):
            self.load("training:\n  exit_after_profile: 3\n")
        with self.assertRaisesRegex(ConfigError, "section.field=value"):
            self.load("{}", ["num_layers=3"])
        with self.assertRaisesRegex(ConfigError, "does not exist"):
            load_config(Path(self.tmp.name) / "missing.yaml")
        with self.assertRaisesRegex(ConfigError, "multiple of training.num_microbatches"):
            gpt_shape(self.load("training:\n  num_microbatches: 3\n"))


if __name__ == "__main__":
    unittest.main()
