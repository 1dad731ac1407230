r"""`tfxl-prepare-classification`: labelled documents (JSON lines, CSV or a folder per label) ->
TFRecords of whole documents and a manifest with the label set and per-label counts, for
`tfxl.classification.DocumentClassifier` (README, "Classify long documents").

    tfxl-prepare-classification --train=topics.jsonl --tokenizer_dir=data/enwik8 \
        --valid_fraction=0.1 --test_fraction=0.1 --output_dir=data/topics
    tfxl-prepare-classification --format=csv --train=train.csv --valid=valid.csv \
        --test=test.csv --text_field=body --label_field=topic --output_dir=gs://b/topics
    tfxl-prepare-classification --format=folders --train=reviews/train --test=reviews/test \
        --valid_fraction=0.05 --output_dir=data/reviews

Token ids are the language model's: --tokenizer_dir is the tfxl-prepare data directory it was
trained on (none: bytes). Every path may be a bucket (gs://...). A bad input is one error line
naming file and line, before anything is published; the manifest is written last, and an
existing data directory is replaced only with --overwrite.
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m`: TensorFlow quiet before the imports below load it
    from tfxl.cli.quiet import quiet_tensorflow
    quiet_tensorflow()

import sys

from absl import flags

from tfxl import cli
from tfxl.data.classification import ClassificationConfig, prepare_classification
from tfxl.data.options import define_flags_of, from_flags

# --help's headings; every ClassificationConfig field is under one (a test keeps it so).
HELP_GROUPS = (
    ("inputs", ("train", "valid", "test", "format", "text_field", "label_field", "errors")),
    ("tokenizer", ("tokenizer_dir",)),
    ("valid and test drawn from train (when not given)",
     ("valid_fraction", "test_fraction", "seed")),
    ("output", ("output_dir", "num_shards", "overwrite")),
)


def define_flags(flag_values=flags.FLAGS) -> None:
    """One flag per `ClassificationConfig` field, generated from it (`tfxl.data.options`)."""
    define_flags_of(ClassificationConfig, flag_values, module_name=__name__)


def config_from_flags(flag_values) -> ClassificationConfig:
    return from_flags(ClassificationConfig, flag_values)


def main(argv, flag_values=flags.FLAGS):
    """tfxl-prepare-classification on parsed flags; a DataError (a ValueError) is the user's:
    tfxl/cli/runner.py prints its one `error:` line and exits 2."""
    del argv  # stray arguments are refused by tfxl/cli/runner.py
    prepare_classification(config_from_flags(flag_values),
                           log=lambda message: print(message, file=sys.stderr))
    return 0


def run():
    """Console-script entry point (`tfxl-prepare-classification`)."""
    cli.run(main, define_flags, help_groups=HELP_GROUPS)


if __name__ == "__main__":
    run()
