"""tfxl-prepare's options, each declared once: a `PrepareConfig` field holds its type, default and
help (``dataclasses.field(metadata={"help": ..., "choices": ...})``).

Everything else is derived from those fields: the ``tfxl-prepare`` flags (`define_flags_of`, as
`tfxl.cli.define_config_flags` does for the model: the flag type from the annotation), the config
a run's flags describe (`from_flags`), and `VocabularyOptions`, the fields a tokenizer's `learn`
reads. A new option is one new field.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import typing
from typing import Optional, Sequence

from tfxl.data.formats import DOCUMENTS, FORMATS
from tfxl.data.sources import CORPORA

# python_stdlib demo corpus defaults (keep `make demo` quick on 2 CPU cores).
STDLIB_TGT_LEN = 64
STDLIB_MAX_TRAIN_BYTES = 4 << 20
STDLIB_MAX_EVAL_BYTES = 256 << 10
DEFAULT_TGT_LEN = 512
ERRORS = ("strict", "replace")

# The kinds of the tokenizer registry (`tfxl.data.tokenizers.TOKENIZERS`, which a test keeps
# equal): named here because the tokenizers are TensorFlow modules, which the tools' --help
# should not wait for, and the registry imports this module (VocabularyOptions).
TOKENIZER_NAMES = ("bytes", "chars", "words", "wordpiece", "sentencepiece")


def option(default=dataclasses.MISSING, help="", choices=None):
    """A `PrepareConfig` field: its default (none: a required field, whose flag defaults to None),
    its flag's help and, for an enum flag, its choices (a sequence, or a function returning one)."""
    metadata = {"help": help}
    if choices is not None:
        metadata["choices"] = choices
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass
class PrepareConfig:
    """Everything `tfxl.data.prepare.prepare` needs; the ``tfxl-prepare`` flags are generated
    from these fields 1:1 (same names, types, defaults and help)."""

    output_dir: str = option(help="Output directory.")
    train: Sequence[str] = option((), "Training files or globs (comma-separated).")
    valid: Sequence[str] = option((), "Validation files or globs.")
    test: Sequence[str] = option((), "Test files or globs.")
    corpus: Optional[str] = option(None, "Embedded corpus instead of --train/--valid/--test.",
                                   choices=CORPORA)
    format: str = option("text", "Input format (jsonl: one JSON object per line, its \"text\" "
                         "is a document).", choices=tuple(FORMATS))
    tokenizer: Optional[str] = option(
        None, "Tokenizer (default: " + ", ".join(
            f"{f.default_tokenizer} for {f.name}" for f in FORMATS.values()) + ").",
        choices=TOKENIZER_NAMES)
    sentencepiece_model: Optional[str] = option(None, "A SentencePiece .model file.")
    sentencepiece_vocab_size: Optional[int] = option(
        None, "Learn a SentencePiece model of this size from the training split instead (needs "
        "the sentencepiece package: pip install '.[sentencepiece]' in a clone of tfxl).")
    min_freq: int = option(1, "words/chars: minimum training count.")
    max_size: int = option(0, "words/chars: maximum vocabulary size including specials "
                           "(0 = unlimited).")
    wordpiece_vocab_size: int = option(8000, "wordpiece: target vocabulary size.")
    wordpiece_sample_bytes: int = option(
        32 << 20, "wordpiece, learned sentencepiece: learn the vocabulary from this many "
        "training bytes.")
    tgt_len: Optional[int] = option(None, f"Tokens per segment T (default {STDLIB_TGT_LEN} for "
                                    f"python_stdlib, else {DEFAULT_TGT_LEN}).")
    num_streams: int = option(16, "Streams per split S.")
    documents: str = option(
        "auto", "Document boundaries: file = keep the format's documents (memory reset between "
        "them): an input file, a jsonl line; none = one long document; auto = file for lm1b "
        "and jsonl.", choices=DOCUMENTS)
    max_train_bytes: int = option(-1, f"Cap on training input bytes (-1: "
                                  f"{STDLIB_MAX_TRAIN_BYTES >> 20} MiB for python_stdlib, else "
                                  "none; 0: none).")
    max_eval_bytes: int = option(-1, f"Cap on valid/test input bytes each (-1: "
                                 f"{STDLIB_MAX_EVAL_BYTES >> 10} KiB for python_stdlib, else "
                                 "none; 0: none).")
    overwrite: bool = option(False, "Replace prepared data in a non-empty --output_dir.")
    errors: str = option("strict", "Invalid UTF-8 for text tokenizers: strict = fail naming file "
                         "and offset; replace = substitute U+FFFD.", choices=ERRORS)
    seed: int = option(0, "Seed for lm1b sentence shuffling.")


# ------------------------------------------------------------------------------ flags
def _flag_kind(annotation) -> str:
    """'bool', 'int', 'float', 'str' or 'list' for a field annotation (Optional[X] is X: the
    flag's None is the field's None)."""
    if typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if annotation in (bool, int, float, str):
        return annotation.__name__
    if typing.get_origin(annotation) in (collections.abc.Sequence, list, tuple):
        return "list"
    raise TypeError(f"no flag type for a field of type {annotation!r}")


def define_flags_of(cls, flag_values, module_name: str) -> None:
    """One absl flag per field of dataclass `cls` (made with `option`), registered as
    `module_name`'s: the annotation gives the flag type, the metadata its help and choices."""
    from absl import flags
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        default = None if field.default is dataclasses.MISSING else field.default
        where = dict(flag_values=flag_values, module_name=module_name)
        help_, choices = field.metadata["help"], field.metadata.get("choices")
        kind = _flag_kind(hints[field.name])
        if choices is not None:
            choices = list(choices() if callable(choices) else choices)
            flags.DEFINE_enum(field.name, default, choices, help_, **where)
        elif kind == "bool":
            flags.DEFINE_bool(field.name, default, help_, **where)
        elif kind == "int":
            flags.DEFINE_integer(field.name, default, help_, **where)
        elif kind == "float":
            flags.DEFINE_float(field.name, default, help_, **where)
        elif kind == "list":
            flags.DEFINE_list(field.name, list(default), help_, **where)
        else:
            flags.DEFINE_string(field.name, default, help_, **where)


def from_flags(cls, flag_values):
    """The `cls` the parsed flags of `define_flags_of(cls, ...)` describe. List flags become
    tuples, as the fields' defaults are: the config of a command line equals the same config
    written in Python."""
    values = {field.name: flag_values[field.name].value for field in dataclasses.fields(cls)}
    return cls(**{name: tuple(value) if isinstance(value, list) else value
                  for name, value in values.items()})


# ------------------------------------------------------------------------------ derived views
# The PrepareConfig fields a tokenizer's `learn` reads (`tfxl.data.tokenizers.learners`).
VOCABULARY_FIELDS = ("min_freq", "max_size", "wordpiece_vocab_size", "wordpiece_sample_bytes",
                     "sentencepiece_model", "sentencepiece_vocab_size")


def _view(name: str, names: Sequence[str], doc: str):
    """A frozen dataclass of some `PrepareConfig` fields, with their types, defaults and help
    (declared there, so never repeated); `of(config)` takes them from a PrepareConfig."""
    hints = typing.get_type_hints(PrepareConfig)
    fields = [(f.name, hints[f.name], dataclasses.field(default=f.default, metadata=f.metadata))
              for f in dataclasses.fields(PrepareConfig) if f.name in names]
    view = dataclasses.make_dataclass(name, fields, frozen=True)
    view.__doc__, view.__module__, view.__qualname__ = doc, __name__, name
    view.of = classmethod(lambda cls, config: cls(**{f.name: getattr(config, f.name)
                                                     for f in dataclasses.fields(cls)}))
    return view


VocabularyOptions = _view(
    "VocabularyOptions", VOCABULARY_FIELDS,
    "How `Tokenizer.learn` builds a vocabulary: tfxl-prepare's options of the same names "
    "(`PrepareConfig` declares them; `VocabularyOptions.of(config)` takes them from one).")
