r"""`tfxl-classify-eval`: a document classifier's loss, accuracy, macro-F1 and confusion matrix
over every document of a split.

    tfxl-classify-eval --model=runs/topics/classifier.keras --data_dir=data/topics \
        --split=test --batch_size=16 --output=runs/topics/test.json

--model is a `.keras` file of a `DocumentClassifier` or the tfxl-classify-train model_dir that
holds one (its classifier.keras), local or gs://; --data_dir a data
directory of tfxl-prepare-classification whose labels are the model's classes. Documents are
read as the model was trained to read them (its reading and max_tokens, saved with it; a file
saved without them: whole documents on the memory), on its segment and memory lengths;
--reading and --max_tokens override. Progress (documents, documents/s) goes to stderr; stdout
carries only the result as one JSON line (per-class F1 and the confusion matrix by label name;
rows are the true labels; `max_tokens`, the bound on the tokens read of each document, null for
whole documents; `most_tokens_per_document`, the most read of any one: max_tokens, or the split's
longest document where that is shorter); --output writes it to a file too.
"""

if __name__ == "__main__":  # `python -m`: TensorFlow quiet before the imports below load it
    from tfxl.cli.quiet import quiet_tensorflow
    quiet_tensorflow()


import sys

from absl import flags

from tfxl import cli
from tfxl.classification.readings import MAX_DOCUMENT_TOKENS, READINGS
from tfxl.data.manifest import split_info
from tfxl.files import check_writable
from tfxl.host import host_memory_bytes
from tfxl.sizing import classifier_evaluation_bytes
from tfxl.tpu import StrategyError, define_flags as define_strategy_flags, strategy_from_flags

# The model, its evaluation and the data reader (Keras, TensorFlow) are imported in the functions
# that use them: --help should not wait for them (tests/test_cli_help.py).

FLAGS = flags.FLAGS
HELP_GROUPS = (("model and data", ("model", "data_dir", "split")),
               ("reading", ("reading", "max_tokens", "batch_size")),
               ("devices", ("strategy", "tpu", "num_gpus")),
               ("result", ("output",)))


def define_flags():
    flags.DEFINE_string("model", None, "A .keras file of a DocumentClassifier, or a "
                        "tfxl-classify-train model_dir (its classifier.keras).")
    flags.DEFINE_string("data_dir", None, "A tfxl-prepare-classification data directory.")
    flags.DEFINE_enum("split", "test", ["train", "valid", "test"], "Split to evaluate.")
    flags.DEFINE_integer("batch_size", 8, "Documents per global batch (a multiple of the "
                         "replicas).", lower_bound=1)
    flags.DEFINE_enum("reading", None, READINGS, "How a document is read: memory, no_memory "
                      "(each segment alone, probabilities averaged) or truncation (default: "
                      "the model's, as it was trained).")
    flags.DEFINE_integer("max_tokens", None, "Read each document's first N tokens only "
                         "(default: the model's, as it was trained; 0: whole documents).",
                         lower_bound=0, upper_bound=MAX_DOCUMENT_TOKENS)
    define_strategy_flags()
    flags.DEFINE_string("output", None, "Also write the result as JSON to this file.")


def load_classifier(path):
    """The DocumentClassifier in the .keras file or tfxl-classify-train model_dir `path`;
    ValueError naming the flag otherwise."""
    from tfxl.classification.classifier import DocumentClassifier
    from tfxl.checkpoints.loading import classifier_file, load_keras_model

    try:
        return load_keras_model(classifier_file(path), DocumentClassifier)
    except ValueError as err:
        raise ValueError(f"--model={err}") from None


def evaluation_batch(batch_size, *, documents, replicas):
    """The global batch of an evaluation: --batch_size, but never more rows than the split's
    documents (rounded up to a multiple of the replicas), since every batch is padded to it."""
    return min(batch_size, -(-documents // replicas) * replicas)


def check_evaluation_size(model, batch, replicas, tokens, limit=None):
    """ValueError naming --batch_size and --max_tokens when one replica's share of a batch of
    `batch` documents of `tokens` tokens would not fit this host's memory (`limit` bytes), before
    anything is allocated (tfxl-eval refuses sizes no machine holds the same way)."""
    tokens = -(-tokens // model.segment_len) * model.segment_len
    rows = max(1, batch // replicas)
    need = replicas * classifier_evaluation_bytes(model.config, model.count_params(), rows, tokens,
                                                  model.segment_len, model.mem_len)
    limit = host_memory_bytes() if limit is None else limit
    if need > limit:
        raise ValueError(f"the estimated memory of this evaluation, {need / 2**30:,.1f} GiB "
                         f"({rows} documents of {tokens:,} tokens per replica, {replicas} "
                         f"replica{'s' * (replicas > 1)}), exceeds this host's "
                         f"{limit / 2**30:.1f} GiB; lower --batch_size ({batch}) or "
                         f"--max_tokens ({tokens:,})")


def progress_printer(total, seconds=10.0, out=None):
    """A `progress(documents_done, elapsed_seconds)` for `evaluate_classifier` printing
    `documents 40/97 (41%), 12.3 documents/s` to stderr at most every `seconds` (and at the
    end)."""
    last = [-seconds]

    def progress(done, elapsed):
        if elapsed - last[0] < seconds and done < total:
            return
        last[0] = elapsed
        print(f"documents {done}/{total} ({100 * done // max(total, 1)}%), "
              f"{done / max(elapsed, 1e-9):.1f} documents/s", file=out or sys.stderr, flush=True)
    return progress


def evaluate_from_flags():
    from tfxl.classification.evaluation import evaluate_classifier
    from tfxl.data.classification import classification_dataset, load_classification_manifest
    from tfxl.checkpoints.loading import check_classifier_fits

    for name in ("model", "data_dir"):
        if not FLAGS[name].value:
            raise ValueError(f"--{name} is required")
    if FLAGS.output:  # checked first: never evaluate and then fail to write
        check_writable(FLAGS.output, "--output")
    manifest = load_classification_manifest(FLAGS.data_dir)
    documents = split_info(manifest, FLAGS.split)["documents"]
    from tfxl.backend import check_tensorflow_tool
    from tfxl.tpu.strategy import check_strategy_name
    check_strategy_name(FLAGS.strategy)  # a JAX strategy's name is refused first
    check_tensorflow_tool(StrategyError)  # the classifier's evaluation is TensorFlow code
    strategy = strategy_from_flags()
    with strategy.scope():
        model = load_classifier(FLAGS.model)
    check_classifier_fits(model, manifest, FLAGS.model, FLAGS.data_dir)
    model.set_reading(reading=FLAGS.reading, max_tokens=FLAGS.max_tokens or None,
                      whole=FLAGS.max_tokens == 0)
    labels = manifest["labels"]
    replicas = strategy.num_replicas_in_sync
    batch = evaluation_batch(FLAGS.batch_size, documents=documents, replicas=replicas)
    max_length = split_info(manifest, FLAGS.split)["max_length"]
    # The most tokens read of one document: the reading's bound, or the longest document.
    most_tokens = min(model.tokens_read or max_length, max_length)
    check_evaluation_size(model, batch, replicas, most_tokens)
    dataset = classification_dataset(FLAGS.data_dir, FLAGS.split, batch,
                                     model.segment_len, max_tokens=model.tokens_read,
                                     manifest=manifest)
    print(f"evaluating {documents} documents of --split={FLAGS.split}: {model.reading} reading, "
          f"{'the first ' + format(model.tokens_read, ',') if model.tokens_read else 'all'} "
          f"tokens of each, batches of {batch}", file=sys.stderr, flush=True)
    metrics = evaluate_classifier(model, dataset, batch, strategy,
                                  progress=progress_printer(documents))
    assert metrics.documents == documents, (metrics.documents, documents)  # every one, once
    return {"split": FLAGS.split, **metrics.to_dict(labels), "reading": model.reading,
            "max_tokens": model.tokens_read, "most_tokens_per_document": most_tokens}


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
