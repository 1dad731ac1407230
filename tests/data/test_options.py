"""tfxl-prepare's options are declared once (`PrepareConfig`): its flags, the config a command line
describes and `VocabularyOptions` are derived from the dataclass fields."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import pytest
from absl import flags

from tfxl.data import prepare as prepare_lib
from tfxl.data.options import PrepareConfig, VocabularyOptions, define_flags_of, from_flags, option
from tfxl.data.tokenizers import TOKENIZERS


def prepare_flags(*argv):
    values = flags.FlagValues()
    prepare_lib.define_flags(values)
    values(["tfxl-prepare", *argv])
    return values


def test_every_prepare_option_is_one_flag_with_the_fields_default_and_help():
    values = prepare_flags("--output_dir=out")
    fields = {field.name: field for field in dataclasses.fields(PrepareConfig)}
    assert sorted(values) == sorted(fields)
    for name, field in fields.items():
        default = None if field.default is dataclasses.MISSING else field.default
        # (absl puts an enum flag's choices before its help: "<a|b>: help")
        assert values[name].help.endswith(field.metadata["help"]) and field.metadata["help"]
        assert values[name].default == (list(default) if isinstance(default, tuple) else default)
    assert values["tokenizer"].parser.enum_values == list(TOKENIZERS)
    # The defaults of the command line are the dataclass's.
    assert prepare_lib.config_from_flags(values) == PrepareConfig(output_dir="out")
    given = prepare_flags("--output_dir=o", "--train=a.txt,b*.txt", "--tokenizer=words",
                          "--sentencepiece_vocab_size=40", "--overwrite", "--documents=file")
    assert prepare_lib.config_from_flags(given) == PrepareConfig(
        output_dir="o", train=("a.txt", "b*.txt"), tokenizer="words",
        sentencepiece_vocab_size=40, overwrite=True, documents="file")
    with pytest.raises(flags.IllegalFlagValueError, match="documents"):
        prepare_flags("--documents=pages")


def test_vocabulary_options_are_the_prepare_options_of_the_same_names():
    vocabulary = {field.name: field for field in dataclasses.fields(VocabularyOptions)}
    prepare = {field.name: field for field in dataclasses.fields(PrepareConfig)}
    assert set(vocabulary) <= set(prepare)
    for name, field in vocabulary.items():
        assert (field.default, field.metadata) == (prepare[name].default, prepare[name].metadata)
    config = PrepareConfig(output_dir="o", min_freq=3, wordpiece_sample_bytes=10, max_size=7)
    assert VocabularyOptions.of(config) == VocabularyOptions(min_freq=3, max_size=7,
                                                             wordpiece_sample_bytes=10)


@dataclasses.dataclass
class _Toy:
    where: str = option(help="Where.")
    paths: Sequence[str] = option(("x",), "Paths.")
    size: Optional[int] = option(None, "Size.")
    loud: bool = option(False, "Loud.")
    mode: str = option("a", "Mode.", choices=lambda: ["a", "b"])


def test_flags_are_generated_from_any_dataclass_of_options():
    values = flags.FlagValues()
    define_flags_of(_Toy, values, module_name=__name__)
    values(["tool", "--where=here", "--size=3", "--loud", "--mode=b"])
    assert from_flags(_Toy, values) == _Toy(where="here", size=3, loud=True, mode="b")
    assert values["paths"].default == ["x"] and values["mode"].parser.enum_values == ["a", "b"]
    assert values.get_flags_for_module(__name__)
