r"""`tfxl-classify-eval`: a document classifier's loss, accuracy, macro-F1 and confusion matrix
over every document of a split.

    tfxl-classify-eval --model=runs/topics/classifier.keras --data_dir=data/topics \
        --split=test --batch_size=16 --output=runs/topics/test.json

--model is a `.keras` file of a `DocumentClassifier` (local or gs://); --data_dir a data
directory of tfxl-prepare-classification whose labels are the model's classes. Documents are
read whole (up to --max_tokens) on the model's segment and memory lengths. stdout carries only
the result as one JSON line (per-class F1 and the confusion matrix by label name; rows are the
true labels); --output writes it to a file too.
"""

if __name__ == "__main__":  # `python -m`: TensorFlow quiet before the imports below load it
    from tfxl.cli.quiet import quiet_tensorflow
    quiet_tensorflow()


from absl import flags

from tfxl import cli
from tfxl.classification.classifier import DocumentClassifier
from tfxl.classification.evaluation import evaluate_classifier
from tfxl.data.classification import classification_dataset, load_classification_manifest
from tfxl.data.manifest import split_info
from tfxl.files import check_writable
from tfxl.models.loading import check_classifier_fits, load_keras_model
from tfxl.tpu import StrategyError, define_flags as define_strategy_flags, strategy_from_flags

FLAGS = flags.FLAGS
HELP_GROUPS = (("model and data", ("model", "data_dir", "split")),
               ("reading", ("batch_size", "max_tokens")),
               ("devices", ("strategy", "tpu", "num_gpus")),
               ("result", ("output",)))


def define_flags():
    flags.DEFINE_string("model", None, "A .keras file of a DocumentClassifier.")
    flags.DEFINE_string("data_dir", None, "A tfxl-prepare-classification data directory.")
    flags.DEFINE_enum("split", "test", ["train", "valid", "test"], "Split to evaluate.")
    flags.DEFINE_integer("batch_size", 8, "Documents per global batch (a multiple of the "
                         "replicas).", lower_bound=1)
    flags.DEFINE_integer("max_tokens", None, "Read each document's first N tokens only "
                         "(default: whole documents).", lower_bound=1)
    define_strategy_flags()
    flags.DEFINE_string("output", None, "Also write the result as JSON to this file.")


def load_classifier(path):
    """The DocumentClassifier in the .keras file `path`; ValueError naming the flag otherwise."""
    try:
        return load_keras_model(path, DocumentClassifier)
    except ValueError as err:
        raise ValueError(f"--model={err}") from None


def evaluate_from_flags():
    for name in ("model", "data_dir"):
        if not FLAGS[name].value:
            raise ValueError(f"--{name} is required")
    if FLAGS.output:  # checked first: never evaluate and then fail to write
        check_writable(FLAGS.output, "--output")
    manifest = load_classification_manifest(FLAGS.data_dir)
    documents = split_info(manifest, FLAGS.split)["documents"]
    strategy = strategy_from_flags()
    with strategy.scope():
        model = load_classifier(FLAGS.model)
    check_classifier_fits(model, manifest, FLAGS.model, FLAGS.data_dir)
    labels = manifest["labels"]
    dataset = classification_dataset(FLAGS.data_dir, FLAGS.split, FLAGS.batch_size,
                                     model.segment_len, max_tokens=FLAGS.max_tokens,
                                     manifest=manifest)
    metrics = evaluate_classifier(model, dataset, FLAGS.batch_size, strategy)
    assert metrics.documents == documents, (metrics.documents, documents)  # every one, once
    return {"split": FLAGS.split, **metrics.to_dict(labels), "max_tokens": FLAGS.max_tokens}


def main(argv):
    del argv  # stray arguments are refused by tfxl/cli/runner.py
    result = evaluate_from_flags()
    cli.print_result(result, FLAGS.output)
    return 0


def run():
    """Console-script entry point (`tfxl-classify-eval`)."""
    cli.run(main, define_flags, errors=(StrategyError,), help_groups=HELP_GROUPS)


if __name__ == "__main__":
    run()
