"""The run configuration of the Python peers, read from the project's YAML files.

Same schema and defaults as the C++ trainer (trainer/config/include/trainer/config/config.h): sections model /
synthetic (read by the synthetic model only) / dataset / training / parallel. Only the fields the peers use are interpreted, but every key is
checked against the known schema so a typo fails here as it does in gpipe_runner.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# Defaults copied from config.h so a YAML file that omits a field means the same thing here.
DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {
        "name": "gpt", "hidden_size": 512, "num_layers": 16, "num_heads": 16,
        "sequence_length": 128, "vocab_size": -1, "ffn_hidden_size": -1, "dropout": 0.0,
        "norm_position": "default", "attention": "auto",
    },
    "synthetic": {
        "forward_ms": 1.0, "input_grad_ms": 1.0, "weight_grad_ms": 1.0, "activation_bytes_per_token": 1024,
    },
    "dataset": {
        "name": "code_search_net", "batch_size": 4, "num_workers": 0, "path": "",
        "tokenizer": "byte", "tokenizer_model": "",
    },
    "training": {
        "learning_rate": 1e-4, "epochs": 2, "num_microbatches": 4, "profile_iteration": 100,
        "exit_after_profile": True, "max_steps": -1, "weight_decay": 0.01, "grad_clip": 1.0,
        "warmup_steps": 0, "min_lr_ratio": 0.1, "seed": 1234, "dtype": "auto", "log_interval": 1,
        "output_dir": "runs/latest", "checkpoint_interval": 0, "checkpoint_dir": "", "keep_checkpoints": 2,
    },
    "parallel": {
        "model_parallel_size": 4, "scheduler": "async_threaded", "use_orion_scheduler": False,
        "schedule": "1f1b", "virtual_stages": 1, "priority": "backward_first", "streams": "per_microbatch", "partition": "uniform",
        "partition_layers": [], "recompute_ratio": [], "device": "auto", "transport": "auto",
        "placement": [], "peer_timeout_s": 120.0, "schedule_file": "", "overlap_f_b": "auto",
        "sync_mode": "bsp", "weight_stashing": True, "data_parallel_size": 1, "dp_bucket_mb": 25.0, "asp_window_steps": 1,
        "partition_file": "", "publish_bubbles_gpu": "", "publish_bubbles_rank": -1,
    },
}

# The byte tokenizer's vocabulary (one id per byte value); used when model.vocab_size is -1.
BYTE_VOCAB_SIZE = 256


class ConfigError(ValueError):
    """A config problem, with the key path and the file in the message."""


@dataclass(frozen=True)
class GPTShape:
    """The numbers that define the GPT and one training step."""
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    sequence_length: int
    ffn_hidden_size: int
    dropout: float
    batch_size: int
    num_microbatches: int

    @property
    def microbatch_size(self) -> int:
        return self.batch_size // self.num_microbatches


def load_config(path: str | Path, overrides: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Reads a YAML config, fills defaults, applies "section.field=value" overrides."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist: pass --config with a YAML file "
                          "(e.g. configs/gpt_cpu_tiny.yaml)")
    with path.open() as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping with sections {list(DEFAULTS)}")
    cfg = copy.deepcopy(DEFAULTS)
    for section, fields in raw.items():
        if section not in DEFAULTS:
            raise ConfigError(f"{path}: unknown section '{section}' (allowed: {', '.join(DEFAULTS)})")
        if not isinstance(fields, dict):
            raise ConfigError(f"{path}: section '{section}' must be a mapping")
        for key, value in fields.items():
            _set(cfg, section, key, value, origin=str(path))
    for assignment in overrides or []:
        if "=" not in assignment or "." not in assignment.split("=", 1)[0]:
            raise ConfigError(f"override '{assignment}': write section.field=value, "
                              "e.g. training.num_microbatches=8")
        key_path, text = assignment.split("=", 1)
        section, key = key_path.split(".", 1)
        if section not in DEFAULTS:
            raise ConfigError(f"override '{assignment}': unknown section '{section}'")
        # As gpipe_runner: a string field takes the text verbatim, other fields parse it as YAML.
        default = DEFAULTS[section].get(key)
        value = text if isinstance(default, str) else yaml.safe_load(text)
        _set(cfg, section, key, value, origin=f"override '{assignment}'")
    return cfg


def _set(cfg: dict, section: str, key: str, value: Any, origin: str) -> None:
    if key not in DEFAULTS[section]:
        raise ConfigError(f"{origin}: unknown key '{section}.{key}' (allowed: "
                          f"{', '.join(DEFAULTS[section])})")
    default = DEFAULTS[section][key]
    # As gpipe_runner: the seed's list form of the partition, and YAML booleans for overlap_f_b.
    if (section, key) == ("parallel", "partition") and isinstance(value, list):
        _set(cfg, section, "partition_layers", value, origin)
        value = "explicit"
    if (section, key) == ("parallel", "overlap_f_b") and isinstance(value, bool):
        value = "true" if value else "false"
    if not _type_matches(value, default):
        raise ConfigError(f"{origin}: '{section}.{key}' = {value!r} has the wrong type "
                          f"(expected {type(default).__name__})")
    cfg[section][key] = float(value) if isinstance(default, float) else value


def _type_matches(value: Any, default: Any) -> bool:
    # bool is a subclass of int in Python: test it first so `true` never passes as a number.
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def gpt_shape(cfg: dict[str, dict[str, Any]]) -> GPTShape:
    """The GPT's shape from a loaded config, with the cross-field checks the trainer also makes."""
    m, d, t = cfg["model"], cfg["dataset"], cfg["training"]
    if m["name"] != "gpt":
        raise ConfigError(f"model.name = '{m['name']}': the Python peers implement only 'gpt'")
    vocab = m["vocab_size"]
    if vocab == -1:
        if d["tokenizer"] != "byte":
            raise ConfigError("model.vocab_size = -1 needs dataset.tokenizer = byte in the peers "
                              "(set model.vocab_size explicitly for sentencepiece)")
        vocab = BYTE_VOCAB_SIZE
    if m["hidden_size"] % m["num_heads"] != 0:
        raise ConfigError(f"model.hidden_size ({m['hidden_size']}) must be a multiple of "
                          f"model.num_heads ({m['num_heads']})")
    if d["batch_size"] % t["num_microbatches"] != 0:
        raise ConfigError(f"dataset.batch_size ({d['batch_size']}) must be a multiple of "
                          f"training.num_microbatches ({t['num_microbatches']})")
    ffn = m["ffn_hidden_size"] if m["ffn_hidden_size"] > 0 else 4 * m["hidden_size"]
    return GPTShape(vocab_size=vocab, hidden_size=m["hidden_size"], num_layers=m["num_layers"],
                    num_heads=m["num_heads"], sequence_length=m["sequence_length"],
                    ffn_hidden_size=ffn, dropout=m["dropout"], batch_size=d["batch_size"],
                    num_microbatches=t["num_microbatches"])
