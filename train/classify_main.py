r"""`tfxl-classify-train`: fine-tune a Transformer-XL document classifier on a
tfxl-prepare-classification data directory, starting from a language model.

    tfxl-classify-train --data_dir=data/topics --model_dir=runs/topics \
        --init_checkpoint=runs/enwik8_base --pooling=last --grad_segments=2 \
        --train_batch_size=16 --train_steps=2000 --eval_every=500 --strategy=mirrored

The run works as tfxl-train's does (the plan and memory check before anything is written,
--dry_run, strategies, host loops, checkpoints and exact resume, run.json, the lease, the train
log, TensorBoard, progress lines, SIGTERM; BUILD.md); its first host loops are short (1, 2,
4, ... steps), so that progress shows from the first steps. The backbone is
--init_checkpoint's language model (a .keras file, e.g. tfxl-convert's output, or a tfxl-train
model_dir), the model flags layered over its config (--tgt_len: the segment length,
--mem_len: the memory, --dropout ...), or without it a new one from --preset/--config. At the
end the classifier is written to model_dir/classifier.keras, tfxl-classify-eval's --model.
"""

if __name__ == "__main__":  # `python -m`: TensorFlow quiet before the imports below load it
    from tfxl.cli.quiet import quiet_tensorflow
    quiet_tensorflow()

import functools

from absl import flags

from tfxl import cli
from tfxl.classification.readings import (MAX_DOCUMENT_TOKENS, MEMORY, NO_MEMORY, POOLINGS,
                                          READINGS, TRUNCATION)
from tfxl.model_dir import CLASSIFICATION, check_data_fingerprint, check_or_store_config
from tfxl.tpu import StrategyError, define_flags as define_strategy_flags
from tfxl.train import backends, flags as train_flags
from tfxl.train.records import lease
from tfxl.train.planning import plan as training_plan
from tfxl.train.records import run_record
from tfxl.train.records import train_log
from tfxl.train.main import failures

# The data reader, the task and the trainer (TensorFlow, Keras) are imported in main(): --help
# should not wait for them (tests/test_cli_help.py).

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("data_dir", None, "Directory written by tfxl-prepare-classification.")
    flags.DEFINE_string("model_dir", None, "Checkpoints, config.json, run.json, TensorBoard "
                        "logs, metrics.json and, at the end, classifier.keras.")
    flags.DEFINE_string(
        "init_checkpoint", None,
        "Start from this language model's backbone: a .keras file (tfxl-convert's output of a "
        "published checkpoint too) or a tfxl-train model_dir (its newest readable checkpoint); "
        "local or gs://. Its config is the backbone's, under the model flags given. Ignored "
        "(with a note) when --model_dir already has checkpoints: the run resumes from them.")
    train_flags.define_model_flags()
    flags.DEFINE_enum("pooling", "last", POOLINGS, "What the head classifies: the last token's "
                      "state, the last segment's mean, or attention over segment summaries.")
    flags.DEFINE_integer("grad_segments", 1, "Trailing segments read with gradient (through "
                         "the memory between them); the segments before are read without.")
    flags.DEFINE_float("head_dropout", 0.0, "Dropout on the pooled features.")
    flags.DEFINE_enum("reading", MEMORY, READINGS, "How a document is read: memory (segment by "
                      "segment on the memory), no_memory (each segment alone, the segments' "
                      "probabilities averaged) or truncation (the first --max_tokens tokens, "
                      "default one segment). Saved in classifier.keras with --max_tokens: "
                      "tfxl-classify-eval and tfxl-export read the same way.")
    flags.DEFINE_integer("max_tokens", None, "Read each document's first N tokens only "
                         "(default: whole documents, every batch padded to the longest; "
                         "--reading=truncation: --tgt_len).", lower_bound=1,
                         upper_bound=MAX_DOCUMENT_TOKENS)
    train_flags.define_training_flags(rows="documents")
    flags.DEFINE_integer("eval_every", 0, "Evaluate every document of the valid split every "
                         "this many steps (0: never): loss, accuracy, macro-F1.")
    flags.DEFINE_integer("eval_max_tokens", None, "Tokens of each valid document read in those "
                         "evaluations, its first (default: as training reads, --max_tokens or "
                         "the longest training document; 0: whole documents).", lower_bound=0,
                         upper_bound=MAX_DOCUMENT_TOKENS)
    train_flags.define_step_flags()
    define_strategy_flags()
    run_record.define_flags()  # --schedule_steps, --allow_run_changes
    lease.define_flags()  # --take_over, --lease_timeout, --lease_settle
    train_log.define_flags()  # --train_log_seconds
    training_plan.define_flags()  # --dry_run, --memory_limit_gib, --ignore_memory_estimate


def load_language_model(path, manifest):
    """The TransfoXLLM at --init_checkpoint=`path`, checked against the data's vocabulary."""
    from tfxl.checkpoints.loading import load_language_model as load  # only with the flag
    try:
        language_model = load(path)
    except ValueError as err:
        raise ValueError(f"--init_checkpoint={err}") from None
    if not path.endswith(".keras"):  # a model_dir records the vocabulary it was trained on
        check_data_fingerprint(path, manifest, FLAGS.data_dir)
    return language_model


def backbone_config(manifest, language_model):
    """The backbone's TransfoXLConfig: the language model's with the model flags over it, else
    --preset/--config/the flags with the data's vocabulary."""
    if language_model is None:
        config = train_flags.model_config(manifest["vocab_size"])
    else:
        config = cli.resolve_config(FLAGS, sources=[(f"--init_checkpoint={FLAGS.init_checkpoint}",
                                                     language_model.config.to_dict())])
    cli.check_transformer_xl(config, "tfxl-classify-train")  # its backbone is Transformer-XL's
    return config


def main(argv):
    del argv
    from tfxl.data.classification import load_classification_manifest
    from tfxl.train.tasks.classification import ClassificationTask
    from tfxl.train.loop.run import TrainingRun, train_from_command_line

    train_flags.check_flag_ranges(FLAGS.flag_values_dict())
    train_flags.require_dir_flags("data_dir", "model_dir")
    manifest = load_classification_manifest(FLAGS.data_dir)
    language_model = (load_language_model(FLAGS.init_checkpoint, manifest)
                      if FLAGS.init_checkpoint else None)
    config = backbone_config(manifest, language_model)
    strategy = backends.strategy_from_flags()
    # Before the classifier is built (the language model above is read as it was saved): the
    # same initial head and dropout stream every run.
    backends.configure_process(mixed_precision=FLAGS.mixed_precision, seed=FLAGS.seed)
    chief = backends.for_strategy(strategy).is_chief
    if chief:
        check_or_store_config(FLAGS.model_dir, config, store=False, kind=CLASSIFICATION)
    max_tokens = FLAGS.max_tokens
    if FLAGS.reading == TRUNCATION and max_tokens is None:
        max_tokens = config.tgt_len  # the first segment
    head = {"num_classes": len(manifest["labels"]), "pooling": FLAGS.pooling,
            "grad_segments": FLAGS.grad_segments, "head_dropout": FLAGS.head_dropout,
            "reading": FLAGS.reading, "max_tokens": max_tokens}
    task = ClassificationTask(config, data_dir=FLAGS.data_dir, head=head,
                              max_tokens=max_tokens, language_model=language_model,
                              init_checkpoint=FLAGS.init_checkpoint,
                              eval_max_tokens=FLAGS.eval_max_tokens)
    task.check_manifest(manifest)
    document_tokens = task.document_tokens(manifest)
    planned = dict(head)
    if FLAGS.reading == NO_MEMORY:  # every segment read alone, each with gradient
        planned["grad_segments"] = document_tokens // config.tgt_len
    # The plan before anything is built: a size no machine holds is refused here, before
    # anything is written (--ignore_memory_estimate runs it anyway).
    plan = training_plan.ClassificationPlan.for_strategy(
        config, strategy, FLAGS.train_batch_size, FLAGS.mixed_precision, FLAGS.optimizer,
        head=planned, document_tokens=document_tokens, jit_compile=FLAGS.jit_compile)
    training_plan.print_plan(plan, FLAGS.memory_limit_gib, FLAGS.ignore_memory_estimate)
    if FLAGS.dry_run:
        print("dry run: nothing written")
        return 0
    options = train_flags.run_options(is_chief=chief)
    run = TrainingRun(task, strategy=strategy, options=options, log=cli.note)
    metrics, status = train_from_command_line(run, FLAGS.train_steps, save_every=FLAGS.save_every,
                                              eval_every=FLAGS.eval_every, log=cli.note,
                                              check_compiled=functools.partial(
                                                  training_plan.check_compiled, plan,
                                                  limit_gib=FLAGS.memory_limit_gib,
                                                  ignore=FLAGS.ignore_memory_estimate))
    if metrics is None:
        return status
    valid = metrics.get("valid")
    print(f"done: step {metrics['step']}, train loss {metrics['train_loss']:.4f}"
          + (f", valid accuracy {valid['accuracy']:.4f}, macro-F1 {valid['macro_f1']:.4f}"
             if valid else "") + f"; classifier in {metrics['classifier']}")
    return 0


def help_groups():
    """--help's headings and the flags under each (every flag of the tool in one)."""
    model = cli.model_flag_names(exclude=("vocab_size",))
    return [
        ("data and model_dir", ["data_dir", "model_dir"]),
        ("classifier (the backbone: --init_checkpoint's, under the model flags)",
         ["init_checkpoint", "reading", "pooling", "grad_segments", "head_dropout",
          "max_tokens"]),
        ("model (without --init_checkpoint: --preset, then --config, then these; --tgt_len "
         "and --mem_len are the segment and memory lengths the documents are read with)", model),
        train_flags.TRAINING_HELP_GROUP,
        ("evaluation and checkpoints", ["eval_every", "eval_max_tokens", "save_every"]),
        train_flags.DEVICES_HELP_GROUP,
        ("run management", ["dry_run", "memory_limit_gib", "ignore_memory_estimate",
                            *train_flags.RUN_MANAGEMENT_FLAGS]),
    ]


def run():
    """Console-script entry point (`tfxl-classify-train`)."""
    cli.run(main, define_flags, errors=(StrategyError,), failures=failures,
            help_groups=help_groups())


if __name__ == "__main__":
    run()
