r"""`tfxl-export`: a trained model as a versioned SavedModel for TF Serving.

    tfxl-export --model=runs/tiny --data_dir=data/stdlib --output_dir=exports/tiny
    # -> exports/tiny/1/saved_model.pb with score (serving_default), init_memory, generate,
    #    score_document, score_document_masked and, with --data_dir, generate_text and score_text
    #    signatures; `saved_model_cli show --dir exports/tiny/1 --all` lists them.
    tfxl-export --model=runs/topics/classifier.keras --data_dir=data/topics \
        --output_dir=exports/topics
    # -> a document classifier's classify_document (serving_default) and, with --data_dir (its
    #    tfxl-prepare-classification data), classify_text (tfxl.classification.signatures).

--model is a .keras file or a tfxl-train model_dir (its newest checkpoint unless --checkpoint).
A version directory is published whole, never over an existing one (BUILD.md).
"""

if __name__ == "__main__":  # `python -m`: TensorFlow quiet before the imports below load it
    from tfxl.cli.quiet import quiet_tensorflow
    quiet_tensorflow()

from absl import flags

from tfxl import cli
from tfxl.classification.readings import MAX_DOCUMENT_TOKENS

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("model", None, "A .keras file (a language model or a "
                        "DocumentClassifier) or a tfxl-train model_dir.")
    flags.DEFINE_string("checkpoint", None, "Checkpoint path inside a model_dir (default latest).")
    flags.DEFINE_string("output_dir", None, "Export base directory; versions go below it.")
    flags.DEFINE_integer("version", None, "Version number, a positive integer (default: the next "
                         "free one).")
    flags.DEFINE_string("data_dir", None, "tfxl-prepare directory whose tokenizer is embedded "
                        "for generate_text and score_text (optional); for a classifier its "
                        "tfxl-prepare-classification directory (tokenizer and label names, for "
                        "classify_text).")
    cli.define_eval_flags(note="; fixed in the export's signatures")
    flags.DEFINE_enum("reading", None, ["memory", "no_memory", "truncation"], "A "
                      "DocumentClassifier only: how its signatures read a document (default: "
                      "the model's, as it was trained).")
    flags.DEFINE_integer("max_tokens", None, "A DocumentClassifier only: the tokens of each "
                         "document its signatures read, the first (default: the model's, as it "
                         "was trained; 0: whole documents).", lower_bound=0,
                         upper_bound=MAX_DOCUMENT_TOKENS)
    flags.DEFINE_integer("score_top_k", 16, "score returns the top-k ids/log-probs per "
                         "position; 0 returns full log-probs [B, T, V].")


def export_classifier_from_flags(model):
    """The export of a DocumentClassifier: it reads as the Python model reads (its segment and
    memory lengths), so the flags that set a language model's reading do not apply."""
    from tfxl.classification.signatures import export_classifier
    from tfxl.checkpoints.loading import load_classifier_data
    given = [f"--{name}" for name in (*cli.eval_overrides(), "score_top_k", "checkpoint")
             if FLAGS[name].present]
    if given:
        raise ValueError(f"{', '.join(given)} does not apply to --model={FLAGS.model}, a "
                         f"DocumentClassifier: its export reads as the model does (segments of "
                         f"{model.segment_len} tokens on {model.mem_len} memory slots)")
    model.set_reading(reading=FLAGS.reading, max_tokens=FLAGS.max_tokens or None,
                      whole=FLAGS.max_tokens == 0)
    tokenizer = labels = None
    if FLAGS.data_dir:
        tokenizer, labels = load_classifier_data(FLAGS.data_dir, model, FLAGS.model)
    return export_classifier(model, FLAGS.output_dir, FLAGS.version, tokenizer, labels,
                             FLAGS.data_dir)


def main(argv):
    del argv
    from tfxl.classification import DocumentClassifier
    from tfxl.models import TransfoXLLM
    from tfxl.checkpoints.loading import (KERAS, load_checked_tokenizer, load_keras_model,
                                     load_language_model, model_kind)
    from tfxl.models.signatures import export_saved_model
    from tfxl.saved_model.publish import check_version
    for name in ("model", "output_dir"):
        if not FLAGS[name].value:
            raise ValueError(f"--{name} is required")
    if FLAGS.version is not None:  # before the (slow) load
        check_version(FLAGS.version)
    if model_kind(FLAGS.model) == KERAS:
        model = load_keras_model(FLAGS.model, (TransfoXLLM, DocumentClassifier))
    else:
        model = load_language_model(FLAGS.model, FLAGS.checkpoint)
    if isinstance(model, DocumentClassifier):
        print(export_classifier_from_flags(model))
        return 0
    given = [f"--{name}" for name in ("reading", "max_tokens") if FLAGS[name].present]
    if given:
        raise ValueError(f"{', '.join(given)} applies to a DocumentClassifier only; "
                         f"--model={FLAGS.model} is a language model")
    tokenizer = None
    if FLAGS.data_dir:
        tokenizer = load_checked_tokenizer(FLAGS.data_dir, FLAGS.model, model.config.vocab_size)
    path = export_saved_model(  # checks the settings before it writes anything
        model, FLAGS.output_dir, FLAGS.version, **cli.eval_overrides(),
        score_top_k=FLAGS.score_top_k,
        tokenizer=tokenizer, data_dir=FLAGS.data_dir)
    print(path)
    return 0


def run():
    cli.run(main, define_flags)


if __name__ == "__main__":
    run()
