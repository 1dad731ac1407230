r"""`tfxl-context`: how much context each model of a group uses (loss by context length, RECL).

    tfxl-context --model=runs/xl --model=runs/xl_small --data_dir=data/stdlib --split=valid \
        --contexts=16,32,48,64 --positions=200 --output_dir=context_out

Each model reads the same --positions targets of the split (drawn with --seed), each with
exactly c previous tokens for every c of --contexts (from an empty memory, in segments of the
evaluation tgt_len on its memory: `tfxl.analysis.context_losses`). The table printed is the
Relative Effective Context Length of each model within the group at each --r
(`tfxl.analysis.recl`, "≥" where a model still gained at the grid's last context). Written:
OUT/context.png (mean loss against context, each model's RECL at the largest r marked), then
OUT/context.json:

    {"contexts": [...], "positions": P, "split": ..., "r": [...],
     "models": {PATH: {"architecture": ..., "loss": [mean loss per context],
                       "recl": {"0.1": c, ...}, "recl_at_least": {"0.1": bool, ...}}}}

with the keys of "models" as given in --model. Cost: P x sum(contexts) token reads per model.
Everything a flag sets is checked before a model is loaded; an existing context.json is kept
unless --overwrite.
"""

if __name__ == "__main__":  # `python -m`: TensorFlow quiet before the imports below load it
    from tfxl.cli.quiet import quiet_tensorflow
    quiet_tensorflow()

import os

from absl import flags

from tfxl import cli

FLAGS = flags.FLAGS

# The most models in one group and targets per model: bounds on the work and its buffers.
MAX_MODELS = 16
MAX_POSITIONS = 1 << 20
PLOTS_MISSING = ("the plot (context.png) needs matplotlib: pip install '.[plots]' in a clone "
                 "of tfxl")


def define_flags():
    flags.DEFINE_multi_string("model", None, "A .keras file or a tfxl-train model_dir; repeat "
                              "for each model of the group.")
    flags.DEFINE_string("data_dir", None, "tfxl-prepare directory of the models' vocabulary.")
    flags.DEFINE_string("split", "valid", "The split whose targets are read.")
    flags.DEFINE_list("contexts", None, "The context lengths c, increasing with one step "
                      "(e.g. 16,32,48,64).")
    flags.DEFINE_integer("positions", 100, "Targets P, drawn over the split with --seed.",
                         lower_bound=1, upper_bound=MAX_POSITIONS)
    flags.DEFINE_list("r", ["0.1", "0.5", "1.0"], "Fractions of the hardest targets that count "
                      "for RECL.")
    flags.DEFINE_float("threshold", 0.01, "The relative gain below which more context no "
                       "longer counts.")
    flags.DEFINE_integer("batch_size", 32, "Targets read together.", lower_bound=1)
    flags.DEFINE_integer("seed", 0, "Which targets are drawn.")
    flags.DEFINE_string("output_dir", None, "Where context.json and context.png go.")
    flags.DEFINE_bool("overwrite", False, "Replace an existing OUT/context.json.")
    cli.define_eval_flags(["tgt_len", "mem_len"])


def parse_grid():
    """(contexts, rs) from the flags, each checked as `recl` checks them."""
    try:
        contexts = [int(c) for c in FLAGS.contexts or []]
    except ValueError:
        raise ValueError(f"--contexts: integers, got {','.join(FLAGS.contexts)}") from None
    steps = {b - a for a, b in zip(contexts, contexts[1:])}
    if len(contexts) < 2 or min(contexts) < 1 or len(steps) != 1 or min(steps) <= 0:
        raise ValueError(f"--contexts: at least two contexts >= 1, increasing with one step "
                         f"(e.g. 16,32,48), got {','.join(map(str, contexts)) or 'none'}")
    try:
        rs = [float(r) for r in FLAGS.r]
    except ValueError:
        raise ValueError(f"--r: fractions in (0, 1], got {','.join(FLAGS.r)}") from None
    if not rs or any(not 0 < r <= 1 for r in rs):
        raise ValueError(f"--r: fractions in (0, 1], got {','.join(FLAGS.r)}")
    if not 0 < FLAGS.threshold < 1:
        raise ValueError(f"--threshold: a relative gain in (0, 1), got {FLAGS.threshold}")
    return contexts, rs


def architecture_of(model):
    """The name `tfxl-train --architecture` gives the model's kind."""
    from tfxl.models import LANGUAGE_MODELS
    if type(model) in LANGUAGE_MODELS.values():
        return model.architecture
    raise ValueError(f"{type(model).__name__} is not a language model tfxl-context reads")


def progress_bar(stream=None):
    """progress(done, total) in token reads: a Keras Progbar (rate and ETA) on stderr where it
    is a terminal (stdout carries the table); None elsewhere (logs and pipes stay quiet)."""
    import contextlib
    import sys

    from tfxl.cli.quiet import stream_is_terminal
    stream = stream or sys.stderr
    if not stream_is_terminal(stream):
        return None
    import keras
    bar = {}

    def progress(done, total):
        with contextlib.redirect_stdout(stream):
            bar.setdefault("bar", keras.utils.Progbar(total, unit_name="token")).update(done)
    return progress


def recl_table(split, positions, contexts, rs, models):
    """The printed table: one row per model, one column per r ("≥": at least)."""
    width = max(len(path) for path in models)
    lines = [f"RECL on {split}: {positions} targets, contexts {contexts[0]}..{contexts[-1]} "
             f"step {contexts[1] - contexts[0]}",
             " ".join([f"{'model':<{width}}", *(f"{f'r={r:g}':>8}" for r in rs)])]
    for path, result in models.items():
        cells = [("≥" if result["recl_at_least"][f"{r:g}"] else "") + str(result["recl"][f"{r:g}"])
                 for r in rs]
        lines.append(" ".join([f"{path:<{width}}", *(f"{cell:>8}" for cell in cells)]))
    return "\n".join(lines)


def save_plot(path, contexts, models, r):
    import io

    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    from tfxl.files import write_text_atomically
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    for name, result in models.items():
        (line,) = axes.plot(contexts, result["loss"], marker="o", label=name)
        recl = result["recl"][f"{r:g}"]
        axes.axvline(recl, color=line.get_color(), linestyle="--", linewidth=1)
    axes.set_xlabel("context (tokens before the target)")
    axes.set_ylabel("mean loss (nats)")
    axes.set_title(f"Loss by context; dashed: RECL at r={r:g}")
    axes.legend()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    pyplot.close(figure)
    write_text_atomically(path, buffer.getvalue())


def main(argv):
    del argv
    if not FLAGS.model:
        raise ValueError("--model is required (repeat it for each model of the group)")
    if len(FLAGS.model) > MAX_MODELS:
        raise ValueError(f"--model: at most {MAX_MODELS} models, got {len(FLAGS.model)}")
    if len(set(FLAGS.model)) != len(FLAGS.model):
        raise ValueError("--model: each model once")
    for name in ("data_dir", "output_dir"):
        if not FLAGS[name].value:
            raise ValueError(f"--{name} is required")
    contexts, rs = parse_grid()
    from tfxl.analysis.context import MAX_BATCH_TOKENS
    if FLAGS.batch_size * (contexts[-1] + 1) > MAX_BATCH_TOKENS:
        raise ValueError(f"--batch_size={FLAGS.batch_size} with a context of {contexts[-1]} "
                         f"reads {FLAGS.batch_size * (contexts[-1] + 1)} tokens at once, more "
                         f"than {MAX_BATCH_TOKENS}; lower --batch_size")
    try:
        import matplotlib  # noqa: F401  (checked before the work, not after)
    except ImportError:
        raise ValueError(PLOTS_MISSING) from None
    import tensorflow as tf

    from tfxl.files import check_writable, write_json_atomically
    result_path = os.path.join(FLAGS.output_dir, "context.json")
    if tf.io.gfile.exists(result_path) and not FLAGS.overwrite:
        raise ValueError(f"{result_path} exists; pass --overwrite to replace it")

    from tfxl.data.split_tokens import split_tokens
    from tfxl.analysis import context_losses, relative_gains, target_positions
    from tfxl.checkpoints.loading import load_checked_tokenizer, load_language_model
    tokens = split_tokens(FLAGS.data_dir, FLAGS.split)
    positions = target_positions(tokens.size, FLAGS.positions, contexts[-1], seed=FLAGS.seed)
    tf.io.gfile.makedirs(FLAGS.output_dir)
    check_writable(result_path, "--output_dir")
    losses, kinds, vocab = {}, {}, None
    for i, path in enumerate(FLAGS.model):
        model = load_language_model(path, any_architecture=True)
        kinds[path] = architecture_of(model)
        if vocab is not None and model.config.vocab_size != vocab[1]:
            raise ValueError(f"--model={path} has a vocabulary of {model.config.vocab_size}, "
                             f"--model={vocab[0]} one of {vocab[1]}: a group reads one "
                             "vocabulary")
        vocab = vocab or (path, model.config.vocab_size)
        load_checked_tokenizer(FLAGS.data_dir, path, model.config.vocab_size)
        cli.note(f"{path}: reading {positions.size} targets at {len(contexts)} contexts "
                 f"({i + 1}/{len(FLAGS.model)})")
        losses[path] = context_losses(model, tokens, positions, contexts,
                                      batch_size=FLAGS.batch_size, tgt_len=FLAGS.tgt_len,
                                      mem_len=FLAGS.mem_len, progress=progress_bar())
    models = {path: {"architecture": kinds[path],
                     "loss": [float(v) for v in losses[path].mean(axis=1)],
                     "recl": {}, "recl_at_least": {}} for path in FLAGS.model}
    for r in rs:
        for path, (value, at_least) in relative_gains(losses, contexts, r).recl(
                FLAGS.threshold).items():
            models[path]["recl"][f"{r:g}"] = int(value)
            models[path]["recl_at_least"][f"{r:g}"] = bool(at_least)
    result = {"contexts": contexts, "positions": int(positions.size), "split": FLAGS.split,
              "r": rs, "threshold": FLAGS.threshold, "models": models}
    print(recl_table(FLAGS.split, positions.size, contexts, rs, models))
    plot_path = os.path.join(FLAGS.output_dir, "context.png")
    save_plot(plot_path, contexts, models, max(rs))
    write_json_atomically(result_path, result)  # last: what readers trust
    print(f"wrote {result_path} and {plot_path}")
    return 0


def run():
    cli.run(main, define_flags)


if __name__ == "__main__":
    run()
