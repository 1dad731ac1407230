"""Model configuration and the paper's presets.

`TransfoXLConfig` is the single description of a model: every layer is built from it, it round-trips
through JSON (the trainer stores it in the model directory), and `PRESETS` holds the settings of the
original scripts (github.com/kimiyoung/transformer-xl: `tf/scripts/*.sh` and `pytorch/run_*.sh`),
each with the evaluation settings the paper used. `TransfoXLConfig.eval_settings` is the one place
that resolves evaluation settings; the command-line tools generate their model flags from the
fields, their help and their range rules (tfxl/cli/model_flags.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import typing
from typing import Optional

# The settings evaluation may choose apart from training's (each has an eval_* field).
EVAL_SETTINGS = ("tgt_len", "mem_len", "clamp_len", "same_length")

# The model kinds a config describes (its `architecture`): Transformer-XL and the two baselines
# the paper compares it with (tfxl.models.language_model_class builds each).
ARCHITECTURES = ("transformer_xl", "transformer", "lstm")


# The range rules of numeric values, one per kind of value: (holds(value, all values), what the
# value must be). Each TransfoXLConfig field names its rule in its metadata; the config's
# validation (a config.json, a --config file, Python) and the model flags' validators
# (tfxl/cli/model_flags.py) apply the same rule, and train/flags.py's FLAG_RULES reuses them.
# NaN holds none of them (every comparison with NaN is false).
POSITIVE = (lambda v, _: 0 < v < math.inf, "> 0")
NON_NEGATIVE = (lambda v, _: 0 <= v < math.inf, ">= 0")
PROBABILITY = (lambda v, _: 0 <= v < 1, "in [0, 1)")
CLAMP = (lambda v, _: -1 <= v < math.inf, ">= -1 (-1: no clamp)")


def _field(default, help, rule=None, choices=None):
    """A TransfoXLConfig field with its help (the model flag's help), its range rule and, for a
    name, the names it may be."""
    return dataclasses.field(default=default, metadata={"help": help, "rule": rule,
                                                        "choices": choices})


@dataclasses.dataclass
class TransfoXLConfig:
    """Hyper-parameters of a Transformer-XL language model.

    Each field's help and range rule are in its metadata (`{"help": ..., "rule": ...}`,
    `field_rules()`): the tools' model flags are generated from them.

    `architecture` says which model the config describes: "transformer_xl" (the default, and
    what a config.json without the field is), or one of the paper's baselines, "transformer"
    (the vanilla Transformer of Al-Rfou et al. 2018, `TransformerLM`) or "lstm" (`LSTMLM`).
    The baselines read the fields that mean something for them and ignore the others, which
    keep their values (docs/baselines.md lists which): a config switches architecture with one
    field.
    """

    architecture: str = _field(
        "transformer_xl", "the model: transformer_xl, or a baseline of the paper: transformer "
        "(absolute positions, a fixed context of tgt_len, no memory) or lstm (n_layer LSTM "
        "layers of d_model units, the state carried between segments).",
        choices=ARCHITECTURES)
    vocab_size: int = _field(256, "number of token ids V.", POSITIVE)
    n_layer: int = _field(2, "number of Transformer-XL blocks L.", POSITIVE)
    d_model: int = _field(64, "hidden size D.", POSITIVE)
    n_head: int = _field(2, "attention heads N.", POSITIVE)
    d_head: int = _field(32, "size of each head H (N*H need not equal D).", POSITIVE)
    d_inner: int = _field(256, "feed-forward hidden size.", POSITIVE)
    d_embed: Optional[int] = _field(None, "size of the first embedding cluster; defaults to "
                                    "d_model.", POSITIVE)
    div_val: int = _field(1, "adaptive embedding divisor: cluster i has d_embed // div_val**i "
                          "dims.", POSITIVE)
    cutoffs: tuple[int, ...] = _field((), "adaptive softmax/embedding cluster boundaries "
                                      "(ascending, < vocab_size); [] means a plain softmax.")
    tie_weight: bool = _field(True, "output cluster weights share the input embedding tables.")
    tie_projs: Optional[tuple[bool, ...]] = _field(
        None, "per cluster, whether the output projection shares the input projection. None "
        "means \"share all but the first\" when div_val > 1 (the wt103/lm1b scripts) and "
        "\"share none\" otherwise.")
    proj_same_dim: bool = _field(True, "with div_val > 1, also project clusters whose size "
                                 "already equals d_model.")
    dropout: float = _field(0.1, "dropout on embeddings, attention output, feed-forward and "
                            "final hidden states.", PROBABILITY)
    dropatt: float = _field(0.0, "dropout on attention probabilities.", PROBABILITY)
    tgt_len: int = _field(64, "training segment length T.", POSITIVE)
    mem_len: int = _field(64, "training memory length M (0 = no recurrence).", NON_NEGATIVE)
    clamp_len: int = _field(-1, "relative distances are clamped to this value; -1 = no clamp.",
                            CLAMP)
    same_length: bool = _field(False, "every query attends to the same number (M + 1) of keys.")
    untie_r: bool = _field(False, "separate content/position biases (u, v) per layer instead of "
                           "shared.")
    pre_lnorm: bool = _field(False, "LayerNorm before each sub-layer instead of after the "
                             "residual.")
    init_std: float = _field(0.02, "std of the normal initialiser for weights and r biases.",
                             POSITIVE)
    proj_init_std: float = _field(0.01, "std of the normal initialiser for adaptive "
                                  "projections.", POSITIVE)
    layer_norm_epsilon: float = _field(1e-5, "LayerNorm epsilon (1e-5 as the PyTorch "
                                       "reference).", POSITIVE)
    eval_tgt_len: Optional[int] = _field(
        None, "evaluation segment length (the paper's evaluation settings; None: tgt_len). The "
        "default of tfxl-eval, tfxl-export, generation and scoring.", POSITIVE)
    eval_mem_len: Optional[int] = _field(None, "evaluation memory length (None: mem_len).",
                                         NON_NEGATIVE)
    eval_clamp_len: Optional[int] = _field(None, "evaluation clamp length, -1 = no clamp (None: "
                                           "clamp_len).", CLAMP)
    eval_same_length: Optional[bool] = _field(None, "same_length for evaluation (None: "
                                              "same_length).")

    def __post_init__(self):
        try:
            self.cutoffs = tuple(int(c) for c in self.cutoffs)
            if self.tie_projs is not None:
                self.tie_projs = tuple(bool(t) for t in self.tie_projs)
        except TypeError:
            raise ValueError(f"TransfoXLConfig: cutoffs and tie_projs must be lists, got "
                             f"{self.cutoffs!r} and {self.tie_projs!r}") from None
        self.validate()

    # -- derived values -------------------------------------------------------------------------
    @property
    def embed_dim(self) -> int:
        return self.d_model if self.d_embed is None else self.d_embed

    @property
    def cluster_tie_projs(self) -> tuple:
        """Per cluster (shortlist first), whether the softmax projection is the embedding's."""
        if self.tie_projs is not None:
            return self.tie_projs
        n = len(self.cutoffs) + 1
        if self.div_val > 1:
            return (False,) + (True,) * (n - 1)
        return (False,) * n

    def eval_settings(self, tgt_len=None, mem_len=None, clamp_len=None, same_length=None) -> dict:
        """The evaluation settings {tgt_len, mem_len, clamp_len, same_length}: each argument that
        is not None, else the config's eval_* field, else the training value. The one place that
        resolves them (tfxl-eval, the trainer's evaluation, export, generation, scoring); raises
        ValueError for a value out of range."""
        return {key: value for key, (value, _) in self.eval_settings_sources(
            tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len,
            same_length=same_length).items()}

    def eval_settings_sources(self, **given) -> dict:
        """eval_settings with where each value came from: {key: (value, source)}, source being
        "argument", "eval_<key>" or "<key> (training)"."""
        unknown = sorted(set(given) - set(EVAL_SETTINGS))
        if unknown:
            raise TypeError(f"eval_settings: unknown setting(s) {unknown}")
        resolved = {}
        for key in EVAL_SETTINGS:
            stored = getattr(self, f"eval_{key}")
            if given.get(key) is not None:
                value, source = given[key], "argument"
            elif stored is not None:
                value, source = stored, f"eval_{key}"
            else:
                value, source = getattr(self, key), f"{key} (training)"
            resolved[key] = (bool(value) if key == "same_length" else int(value), source)
        for key, low in (("tgt_len", 1), ("mem_len", 0), ("clamp_len", -1)):
            if resolved[key][0] < low:
                raise ValueError(f"evaluation {key} must be >= {low}, got {resolved[key][0]}")
        return resolved

    def replace(self, **changes) -> "TransfoXLConfig":
        return dataclasses.replace(self, **changes)

    # -- checks ---------------------------------------------------------------------------------
    def validate(self) -> None:
        def need(ok, what):
            if not ok:
                raise ValueError(f"TransfoXLConfig: {what}")

        need(self.architecture in ARCHITECTURES, f"architecture must be one of "
             f"{', '.join(ARCHITECTURES)}, got {self.architecture!r}")
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            kind, value = scalar_type(hints[f.name]), getattr(self, f.name)
            if value is None and is_optional(hints[f.name]):
                continue
            if kind is not None:
                need(_is_a(kind, value), f"{f.name} must be {'a finite ' * (kind is float)}"
                     f"{kind.__name__}, got {value!r}")
                setattr(self, f.name, kind(value))  # e.g. 2.0 from JSON -> 2; 0/1 -> bool
            holds, rule = f.metadata.get("rule") or (None, None)
            if holds is not None:
                need(holds(getattr(self, f.name), None), f"{f.name} must be {rule}, got {value!r}")
        need(self.d_model % 2 == 0, f"d_model must be even (sin/cos halves), got {self.d_model}")
        cut = list(self.cutoffs)
        need(cut == sorted(set(cut)) and all(0 < c < self.vocab_size for c in cut),
             f"cutoffs must be strictly increasing and inside (0, vocab_size={self.vocab_size}), "
             f"got {cut}")
        need(self.embed_dim // self.div_val ** len(cut) > 0,
             f"d_embed={self.embed_dim} with div_val={self.div_val} leaves a cluster with 0 dims")
        if self.tie_projs is not None:
            need(len(self.tie_projs) == len(cut) + 1, f"tie_projs needs one flag per cluster "
                 f"({len(cut) + 1}), got {len(self.tie_projs)}")

    # -- (de)serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["cutoffs"] = list(self.cutoffs)
        d["tie_projs"] = None if self.tie_projs is None else list(self.tie_projs)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TransfoXLConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"TransfoXLConfig: unknown field(s) {unknown}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TransfoXLConfig":
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_file(cls, path: str) -> "TransfoXLConfig":
        """The config in a JSON file (local or any tf.io.gfile path, e.g. gs://); one ValueError
        naming the file for any problem with it."""
        # tfxl.files loads TensorFlow: imported here so that this module never does.
        from tfxl.files import read_json
        data = read_json(path, "model config")
        try:
            return cls.from_dict(data)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None


def is_optional(hint) -> bool:
    return typing.get_origin(hint) is typing.Union and type(None) in typing.get_args(hint)


def scalar_type(hint):
    """int, float or bool for a field of that type (or Optional of it); None for the lists."""
    if is_optional(hint):
        hint = next(k for k in typing.get_args(hint) if k is not type(None))
    return hint if hint in (int, float, bool) else None


def _is_a(kind, value) -> bool:
    """Whether a value (from JSON, a flag or Python) is of the field's type: bool true/false
    (or 0/1), int a whole number, float a finite number."""
    if kind is bool:
        return isinstance(value, (bool, numbers.Integral)) and value in (0, 1)
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
        return False
    return kind is float or float(value).is_integer()


def field_rules() -> dict:
    """{field: (holds(value, values), what it must be)}: the range rule of each numeric field."""
    return {f.name: f.metadata["rule"] for f in dataclasses.fields(TransfoXLConfig)
            if f.metadata.get("rule")}


# The original scripts' settings (kimiyoung/transformer-xl tf/scripts/*.sh, pytorch/run_*.sh).
# Vocabulary sizes are the published corpora's; the trainer overrides vocab_size (and suggested
# cutoffs) from the data manifest.
PRESETS = {
    "tiny": dict(
        vocab_size=258, n_layer=2, d_model=64, n_head=2, d_head=32, d_inner=256, dropout=0.1,
        dropatt=0.0, tgt_len=64, mem_len=64, eval_tgt_len=32, eval_mem_len=128,
    ),
    "enwik8_base": dict(
        vocab_size=204, n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048, dropout=0.1,
        dropatt=0.0, tgt_len=512, mem_len=512, eval_tgt_len=80, eval_mem_len=2100,
        eval_clamp_len=820, eval_same_length=True,
    ),
    "text8_base": dict(
        vocab_size=27, n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048, dropout=0.1,
        dropatt=0.0, tgt_len=512, mem_len=512, eval_tgt_len=80, eval_mem_len=2100,
        eval_clamp_len=820, eval_same_length=True,
    ),
    "enwik8_large": dict(
        vocab_size=204, n_layer=24, d_model=1024, n_head=8, d_head=128, d_inner=3072,
        dropout=0.15, dropatt=0.15, tgt_len=768, mem_len=768, eval_tgt_len=128,
        eval_mem_len=3800, eval_clamp_len=1000, eval_same_length=True,
    ),
    "text8_large": dict(
        vocab_size=27, n_layer=24, d_model=1024, n_head=8, d_head=128, d_inner=3072,
        dropout=0.15, dropatt=0.15, tgt_len=768, mem_len=768, eval_tgt_len=128,
        eval_mem_len=3800, eval_clamp_len=1000, eval_same_length=True,
    ),
    "wt103_base": dict(
        vocab_size=267735, n_layer=16, d_model=410, n_head=10, d_head=41, d_inner=2100,
        cutoffs=(20000, 40000, 200000), div_val=1, untie_r=True,
        tie_projs=(False, True, True, True), dropout=0.1, dropatt=0.0, tgt_len=150, mem_len=150,
        eval_tgt_len=64, eval_mem_len=640, eval_clamp_len=400, eval_same_length=True,
    ),
    "wt103_large": dict(
        vocab_size=267735, n_layer=18, d_model=1024, n_head=16, d_head=64, d_inner=4096,
        cutoffs=(20000, 40000, 200000), div_val=4, untie_r=True, proj_same_dim=True,
        tie_projs=(False, True, True, True), init_std=0.005, dropout=0.2, dropatt=0.2,
        tgt_len=384, mem_len=384, eval_tgt_len=128, eval_mem_len=1600, eval_clamp_len=1000,
        eval_same_length=True,
    ),
    "lm1b_base": dict(
        vocab_size=793470, n_layer=18, d_model=1024, n_head=8, d_head=128, d_inner=4096,
        cutoffs=(60000, 100000, 640000), div_val=4, untie_r=True, dropout=0.1, dropatt=0.0,
        tgt_len=256, mem_len=256, eval_tgt_len=32, eval_mem_len=128, eval_same_length=True,
    ),
    "lm1b_large": dict(
        vocab_size=793470, n_layer=24, d_model=1280, n_head=16, d_head=80, d_inner=8192,
        cutoffs=(60000, 100000, 640000), div_val=4, untie_r=True, init_std=0.005, dropout=0.05,
        dropatt=0.05, tgt_len=32, mem_len=32, eval_tgt_len=32, eval_mem_len=128,
        eval_same_length=True,
    ),
}


def get_preset(name: str, **overrides) -> TransfoXLConfig:
    """The named preset as a config, with `overrides` applied (e.g. vocab_size from the data)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return TransfoXLConfig(**{**PRESETS[name], **overrides})
