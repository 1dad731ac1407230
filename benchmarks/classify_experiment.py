"""The classification benchmark's run, "does the memory make document classification work?"
(benchmarks/classify_bench.py at `BENCH_SIZES`, BENCHMARKS.md "Document classification"; the
demo, benchmarks/classify_demo.py and `make demo-classify`, at smaller sizes). Same run, same
splits:

1. data from the running Python's own Lib/ (`tfxl.data.stdlib_classification`): the .py files of
   a dozen top-level packages are documents labelled by package; every other .py file is the
   language model's corpus. Both go through the product path: `tfxl.data.prepare.prepare`
   (bytes tokenizer) and `prepare_classification` (seeded test draw).
2. a `tiny`-shaped LM pretrained on the corpus through `tfxl.train.loop.run.TrainingRun`.
3. three classifiers fine-tuned from it (`DocumentClassifier.from_language_model`, Keras `fit`
   on `classification_dataset`, the same optimizer, batch and epochs):
   * memory: reads the first N_train tokens in segments of T on a memory of M slots;
   * no memory: trained on one random T-token window per document per epoch, mem_len 0; a
     document's prediction is the mean of its segments' probabilities (each of its first N
     tokens' segments read alone, every non-empty segment weighted equally);
   * truncation: trained and evaluated on the first T tokens only (BERT-style).
   Each is evaluated on the test split reading the first N tokens for several N.
4. a synthetic long-range probe: a document is a run of `X` + random lowercase filler + a run
   of `Y` (X, Y in {A, B}, runs of `probe_marker` bytes), label "same" iff X == Y. The evidence
   is split between the two ends, thousands of tokens apart: a single segment, a mean over
   segments or the first T tokens all carry no information about the label (chance); reading
   with a memory that reaches back to X can solve it. (A probe whose label is a marker alone
   would be solved by the segment mean.) Trained from a fresh backbone on a curriculum
   (`probe_stages`): documents of about one segment first, where the gradient toward X is
   strong, then longer ones up to thousands of bytes. Runs of 8 rather than single marker
   bytes: with single bytes the `tiny` model did not learn the XOR even within one 120-byte
   segment (training loss 0.70 after 6 epochs of 32 steps, Adam 3e-3), with runs of 8 it did in
   2 (loss 0.003); trained on 2,048 bytes from the start, the loss stayed at ln 2. Tested at
   several lengths, one beyond the memory's reach (M + T tokens): there the memory cannot help,
   and it should not.
5. documents/second: training (the memory classifier's `fit`, epochs after the first) and
   inference (a compiled predict step over the test split; with memory on the key/value memory,
   as the `classify_document` signature reads).

A `Trial` is what the three readings are fine-tuned and tested on: the stdlib packages
(`stdlib_trial`) and the probe's curriculum (`probe_trial`), each run by `run_trial`.
"""

import dataclasses
import json
import os
import time
from typing import Optional, Sequence, Tuple

import keras

from tfxl.classification.readings import READINGS as CLASSIFIER_READINGS
from tfxl.data.stdlib_classification import STDLIB_PACKAGES

# Shape glossary (tfxl's): B batch, T segment length, M memory slots, N tokens read, C classes.


@dataclasses.dataclass
class Sizes:
    """Everything a run's cost and result depend on (the benchmark's and the demo's)."""

    model: dict = dataclasses.field(default_factory=dict)  # overrides of the `tiny` preset
    packages: Sequence[str] = STDLIB_PACKAGES  # the candidate classes
    lm_steps: int = 1000                  # pretraining steps; 0: a fresh backbone, no corpus
    lm_batch: int = 16
    lm_segment_len: int = 128             # T = M of pretraining
    lm_max_train_bytes: int = 4 << 20
    max_per_package: Optional[int] = None  # documents drawn per package (seeded); None: all
    test_fraction: float = 0.3
    segment_len: int = 128                # the classifiers' T
    mem_len: int = 2048                   # the memory classifier's M
    train_tokens: int = 1024              # N read in fine-tuning (memory classifier)
    # Every trained segment back-propagated (train_tokens / segment_len), pooled by attention
    # over the segment summaries: 0.645 against 0.331 with grad_segments 2 and `last` pooling
    # (BENCHMARKS.md). The probe keeps `last` (its evidence is at the two ends).
    grad_segments: int = 8
    pooling: str = "segment_attention"    # tfxl.classification.pooling, every reading's
    epochs: int = 6
    batch: int = 8
    learning_rate: float = 2e-3
    tokens_read: Sequence[int] = (128, 512, 1024, 2048, 4096)
    probe_train: int = 384                # probe training documents per stage; 0: no probe
    probe_test: int = 100                 # probe test documents per length
    probe_marker: int = 8                 # bytes in each marker run
    probe_stages: Sequence[Tuple[int, int]] = ((120, 2), (512, 4), (2048, 6))  # (bytes, epochs)
    probe_test_lengths: Sequence[int] = (512, 2048, 4096)
    probe_pooling: str = "last"
    probe_grad_segments: int = 2
    seed: int = 0
    eager: bool = False                   # no tf.function: for runs of a step or two, where
                                          # tracing costs more than the steps


BENCH_SIZES = Sizes()

# The classifier's own readings (`DocumentClassifier(reading=...)`, tfxl-classify-train's and
# tfxl-classify-eval's --reading): the demo and the benchmark read as the tools do.
MEMORY, SEGMENTS, TRUNCATION = CLASSIFIER_READINGS
READINGS = (MEMORY, SEGMENTS, TRUNCATION)
READING_NAMES = {MEMORY: "with memory", SEGMENTS: "no memory (mean of segment probabilities)",
                 TRUNCATION: "truncation (first T)"}  # in every table and plot


# -- data -------------------------------------------------------------------------------------
def prepare_stdlib_data(work, sizes, stdlib_root=None, log=print):
    """Prepares the LM corpus (unless sizes.lm_steps == 0) and the classification data under
    `work`; returns (lm_data_dir or None, classification data dir, task summary dict)."""
    import tensorflow as tf

    from tfxl.data.classification import ClassificationConfig, prepare_classification
    from tfxl.data.prepare import PrepareConfig, prepare
    from tfxl.data.stdlib_classification import stdlib_classification_task, write_labelled_jsonl

    task = stdlib_classification_task(stdlib_root, sizes.packages,
                                      max_per_package=sizes.max_per_package, seed=sizes.seed)
    tf.io.gfile.makedirs(work)  # only once the library made a task
    lm_dir = None
    if sizes.lm_steps:
        lm_dir = os.path.join(work, "lm_data")
        prepare(PrepareConfig(output_dir=lm_dir, train=list(task.lm_train),
                              valid=list(task.lm_valid), tokenizer="bytes",
                              tgt_len=sizes.lm_segment_len,
                              max_train_bytes=sizes.lm_max_train_bytes, overwrite=True),
                log=lambda *a: None)
    jsonl = os.path.join(work, "stdlib_documents.jsonl")
    skipped = write_labelled_jsonl(jsonl, task)
    cls_dir = os.path.join(work, "stdlib_classification")
    manifest = prepare_classification(ClassificationConfig(
        output_dir=cls_dir, train=[jsonl], format="jsonl", tokenizer_dir=lm_dir,
        valid_fraction=0.0, test_fraction=sizes.test_fraction, seed=sizes.seed, overwrite=True))
    summary = {"stdlib": task.root, "documents_per_label": task.counts(),
               "skipped_not_utf8": skipped, "lm_corpus_files": len(task.lm_train),
               "lm_valid_files": len(task.lm_valid),
               "splits": {s: {k: manifest["splits"][s][k] for k in ("documents", "tokens")}
                          for s in ("train", "test")}}
    log(f"stdlib task: {len(task.documents)} documents, {len(task.labels)} labels "
        f"({', '.join(f'{k} {v}' for k, v in task.counts().items())}); "
        f"train {summary['splits']['train']['documents']}, "
        f"test {summary['splits']['test']['documents']}; LM corpus {len(task.lm_train)} files")
    return lm_dir, cls_dir, summary


def probe_documents(count, length, seed, marker=1):
    """The long-range probe (module docstring): `count` JSON-ready {"text", "label"} documents of
    `length` bytes, a run of `marker` bytes at each end, labels balanced in expectation (`seed`:
    an int or a sequence of ints)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
    documents = []
    for _ in range(count):
        first, last = rng.choice([b"A", b"B"], size=2)
        filler = letters[rng.integers(0, len(letters), length - 2 * marker)].tobytes()
        documents.append({"text": (first * marker + filler + last * marker).decode("ascii"),
                          "label": "same" if first == last else "different"})
    return documents


def prepare_probe_data(work, length, sizes):
    """A classification data dir of probe documents of `length` bytes (sizes.probe_train
    training and sizes.probe_test test documents, each drawn from its own seed), bytes
    tokenizer: the probe's backbone is fresh."""
    import tensorflow as tf

    from tfxl.data.classification import ClassificationConfig, prepare_classification
    tf.io.gfile.makedirs(work)
    paths = {}
    for split, count, stream in (("train", sizes.probe_train, 0), ("test", sizes.probe_test, 1)):
        paths[split] = os.path.join(work, f"probe_{length}_{split}.jsonl")
        with tf.io.gfile.GFile(paths[split], "w") as f:
            for document in probe_documents(count, length, (sizes.seed, length, stream),
                                            sizes.probe_marker):
                f.write(json.dumps(document) + "\n")
    out = os.path.join(work, f"probe_{length}")
    prepare_classification(ClassificationConfig(
        output_dir=out, train=[paths["train"]], test=[paths["test"]], format="jsonl",
        valid_fraction=0.0, overwrite=True))
    return out


# -- models -----------------------------------------------------------------------------------
def lm_config(sizes, vocab_size):
    from tfxl.config import get_preset
    return get_preset("tiny", **{"vocab_size": vocab_size, "tgt_len": sizes.lm_segment_len,
                                 "mem_len": sizes.lm_segment_len, **sizes.model})


def pretrain(lm_dir, model_dir, sizes, log=print):
    """Trains the LM with tfxl's trainer (as `make demo` does); returns its final metrics."""
    import tensorflow as tf

    from tfxl.data.manifest import load_manifest
    from tfxl.train.backends import configure_process
    from tfxl.train.tasks.language_model import LanguageModelTask
    from tfxl.train.loop.run import RunOptions, TrainingRun
    from tfxl.train.loop.optimization import OptimizerParams

    manifest = load_manifest(lm_dir)
    config = lm_config(sizes, manifest["vocab_size"])
    log(f"pretraining the language model: {sizes.lm_steps} steps of {sizes.lm_batch} x "
        f"{sizes.lm_segment_len} tokens")
    opt = OptimizerParams(learning_rate=2e-3, warmup_steps=min(100, sizes.lm_steps // 10),
                          min_lr_ratio=0.05, train_steps=sizes.lm_steps, clip=0.25)
    configure_process(mixed_precision="float32", seed=sizes.seed)
    runner = TrainingRun(
        LanguageModelTask(config, data_dir=lm_dir), strategy=tf.distribute.get_strategy(),
        options=RunOptions(model_dir=model_dir, global_batch=sizes.lm_batch, optimizer=opt,
                           jit_compile=True, steps_per_loop=min(100, sizes.lm_steps),
                           seed=sizes.seed))
    start = time.perf_counter()
    metrics = runner.train(log=lambda *a: None)
    valid = runner.evaluate("valid", batch_size=manifest["num_streams"])
    log(f"pretrained {sizes.lm_steps} steps in {time.perf_counter() - start:.0f} s, "
        f"valid bpc {valid['bpc']:.3f}")
    return {"steps": sizes.lm_steps, "seconds": time.perf_counter() - start,
            "valid_bpc": valid["bpc"], "train_loss": metrics["train_loss"]}


def classifier(reading, sizes, num_classes, lm_model_dir, vocab_size):
    """A fresh-headed classifier for `reading`, from the pretrained LM (or a fresh backbone)."""
    from tfxl.classification import DocumentClassifier
    kwargs = dict(num_classes=num_classes, pooling=sizes.pooling, segment_len=sizes.segment_len,
                  mem_len=sizes.mem_len if reading == MEMORY else 0,
                  grad_segments=sizes.grad_segments if reading == MEMORY else 1, reading=reading)
    if lm_model_dir:
        return DocumentClassifier.from_language_model(lm_model_dir, **kwargs)
    keras.utils.set_random_seed(sizes.seed)  # the fresh backbones start the same
    return DocumentClassifier(lm_config(sizes, vocab_size), **kwargs)


def training_dataset(reading, data_dir, sizes, train_tokens):
    """Static-shape batches for `reading` (module docstring): the first N_train tokens, one
    random T-token window of them, or the first T."""
    import tensorflow as tf

    from tfxl.data.classification import classification_dataset
    T = sizes.segment_len
    n = T if reading == TRUNCATION else train_tokens
    dataset = classification_dataset(data_dir, "train", sizes.batch, T, shuffle=True,
                                     seed=sizes.seed, max_tokens=n, pad_to_max_tokens=True)
    if reading != SEGMENTS:
        return dataset

    def random_window(features, labels):
        ids, lengths = features["token_ids"], features["lengths"]
        starts = tf.cast(tf.random.uniform(tf.shape(lengths)) * tf.cast(
            tf.maximum(lengths - T, 0) + 1, tf.float32), tf.int32)
        index = tf.minimum(starts[:, None] + tf.range(T)[None, :], tf.shape(ids)[1] - 1)
        return {"token_ids": tf.gather(ids, index, batch_dims=1),
                "lengths": tf.minimum(lengths - starts, T)}, labels
    return dataset.map(random_window)


class EpochSeconds(keras.callbacks.Callback):
    """The wall time of each epoch of a `fit`, and a progress line per epoch through `log`."""

    def __init__(self, log=None, what="fine-tuning"):
        super().__init__()
        self.log, self.what = log, what

    def on_train_begin(self, logs=None):
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self.start)
        if self.log is not None:
            self.log(f"{self.what}: epoch {epoch + 1}/{self.params['epochs']}, loss "
                     f"{(logs or {}).get('loss', float('nan')):.3f}, {self.seconds[-1]:.0f} s")


def compile_for_fine_tuning(model, sizes):
    """Adam with clipnorm 1, a tf.function step (XLA's compile of the segment loop costs more
    than it saves at these sizes); one optimizer for every stage `fine_tune` then runs."""
    model.compile(optimizer=keras.optimizers.Adam(sizes.learning_rate, clipnorm=1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False, run_eagerly=sizes.eager)


def fine_tune(model, dataset, epochs, log=None, what="fine-tuning"):
    """Keras `fit` of a compiled model; returns the seconds and the training loss of each
    epoch (each also a progress line through `log`)."""
    times = EpochSeconds(log, what)
    # shuffle=False: the dataset shuffles itself (Keras' own flag would only warn)
    history = model.fit(dataset, epochs=epochs, verbose=0, shuffle=False, callbacks=[times])
    return times.seconds, [float(x) for x in history.history["loss"]]


# -- evaluation -------------------------------------------------------------------------------
def predict_step(model, eager=False, key_value_memory=False):
    """A forward pass, probabilities [B, C]: a tf.function (one trace for every batch shape)
    unless `eager`. key_value_memory: read as the `classify_document` signature does (each
    segment projects only its own keys and values; the same logits, tested in
    tests/classification)."""
    import tensorflow as tf

    def step(inputs):
        return keras.ops.softmax(model(inputs, training=False,
                                       key_value_memory=key_value_memory))
    return step if eager else tf.function(step, reduce_retracing=True, autograph=False)


def probabilities(model, reading, data_dir, n_tokens, sizes, step=None):
    """(probabilities [D, C], labels [D]) of the test split's documents read as `reading` does
    on their first `n_tokens` tokens (truncation: the first T whatever n_tokens)."""
    import numpy as np

    from tfxl.data.classification import classification_dataset
    T = sizes.segment_len
    n = T if reading == TRUNCATION else -(-n_tokens // T) * T
    step = step or predict_step(model, sizes.eager)
    probs, labels = [], []
    for features, label in classification_dataset(data_dir, "test", sizes.batch, T,
                                                  max_tokens=n, pad_to_max_tokens=True):
        # No memory: the classifier reads every T-token segment alone and averages the
        # probabilities over the document's non-empty ones (reading="no_memory").
        probs.append(step(features).numpy())
        labels.append(label.numpy())
    return np.concatenate(probs), np.concatenate(labels)


def scores(probs, labels, num_classes):
    """accuracy, macro-F1 and loss of the predictions (tfxl's evaluation rules)."""
    import numpy as np

    from tfxl.classification.evaluation import metrics_from_confusion
    confusion = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(confusion, (labels, probs.argmax(axis=1)), 1)
    loss = -np.log(np.maximum(probs[np.arange(len(labels)), labels], 1e-12)).sum()
    m = metrics_from_confusion(confusion, loss)
    return {"accuracy": m.accuracy, "macro_f1": m.macro_f1, "loss": m.loss,
            "documents": m.documents}


@dataclasses.dataclass
class Trial:
    """What the three readings are fine-tuned on and tested on (the stdlib packages, the probe).

    stages: [(data_dir, epochs, train_tokens)], trained in order, one optimizer throughout; the
      memory and no-memory readings read the first train_tokens tokens of each document,
      truncation the first T.
    tests: {key: (data_dir, tokens)}: the test split of data_dir read on its first `tokens`
      tokens (truncation: the first T of each data_dir), reported under `key`.
    main: the key of the headline accuracy (truncation: its entry for main's data_dir).
    """

    name: str
    stages: Sequence[Tuple[str, int, int]]
    tests: dict
    main: str
    by: str = "by_tokens_read"  # what the keys count (the results' field name)


def reading_tests(trial, reading, sizes):
    """{key: (data_dir, tokens)} of `reading`: the trial's tests, or for truncation the first T
    tokens of each of their data dirs, under the first key naming it."""
    if reading != TRUNCATION:
        return dict(trial.tests)
    firsts = {}
    for key, (data_dir, _) in trial.tests.items():
        firsts.setdefault(data_dir, key)
    return {key: (data_dir, sizes.segment_len) for data_dir, key in firsts.items()}


def run_trial(trial, sizes, lm_model_dir, log=print):
    """Fine-tunes and tests the three readings on `trial`; returns the results dict."""
    from tfxl.data.classification import load_classification_manifest
    manifest = load_classification_manifest(trial.stages[-1][0])
    num_classes, vocab_size = len(manifest["labels"]), manifest["vocab_size"]
    main_dir = trial.tests[trial.main][0]
    test_documents = load_classification_manifest(main_dir)["splits"]["test"]["documents"]
    result = {"labels": manifest["labels"],
              "train_documents": manifest["splits"]["train"]["documents"],
              "test_documents": test_documents, "readings": {}}
    for reading in READINGS:
        model = classifier(reading, sizes, num_classes, lm_model_dir, vocab_size)
        compile_for_fine_tuning(model, sizes)
        entry = {"stages": [], trial.by: {}}
        for data_dir, epochs, train_tokens in trial.stages:
            epoch_seconds, losses = fine_tune(
                model, training_dataset(reading, data_dir, sizes, train_tokens), epochs, log,
                f"{trial.name} {reading}, {train_tokens}-token documents")
            documents = load_classification_manifest(data_dir)["splits"]["train"]["documents"]
            entry["stages"].append({"train_tokens": train_tokens, "documents": documents,
                                    "epoch_seconds": epoch_seconds, "losses": losses})
        last = entry["stages"][-1]
        timed = last["epoch_seconds"][1:] or last["epoch_seconds"]
        entry["final_train_loss"] = last["losses"][-1]
        entry["train_documents_per_second"] = last["documents"] * len(timed) / sum(timed)
        step = predict_step(model, sizes.eager, key_value_memory=reading == MEMORY)
        tests = reading_tests(trial, reading, sizes)
        for key, (data_dir, n) in tests.items():
            start = time.perf_counter()
            probs, labels = probabilities(model, reading, data_dir, n, sizes, step)
            first = time.perf_counter() - start
            entry[trial.by][key] = {**scores(probs, labels, num_classes), "tokens_read": n,
                                   "seconds_with_compile": first}
        main = next(k for k, (d, _) in tests.items() if d == main_dir) if (
            reading == TRUNCATION) else trial.main
        n_main = tests[main][1]
        start = time.perf_counter()  # compiled already: the inference throughput
        probabilities(model, reading, main_dir, n_main, sizes, step)
        entry["inference"] = {"tokens_read": n_main, "documents_per_second":
                              test_documents / (time.perf_counter() - start)}
        headline = entry[trial.by][main]
        entry.update(accuracy=headline["accuracy"], macro_f1=headline["macro_f1"],
                     tokens_read=n_main)
        stage_losses = ", ".join(f"{stage['losses'][-1]:.3f}" for stage in entry["stages"])
        log(f"{trial.name} {reading:>10}: accuracy {headline['accuracy']:.3f}, macro-F1 "
            f"{headline['macro_f1']:.3f} reading {n_main} tokens; train "
            f"{entry['train_documents_per_second']:.1f} docs/s (loss by stage "
            f"{stage_losses}), inference "
            f"{entry['inference']['documents_per_second']:.1f} docs/s; {trial.by}: "
            + ", ".join(f"{k} {r['accuracy']:.3f}" for k, r in entry[trial.by].items()))
        result["readings"][reading] = entry
    return result


def stdlib_trial(data_dir, sizes):
    """The stdlib packages, read on their first N tokens for each N of sizes.tokens_read."""
    return Trial("stdlib", [(data_dir, sizes.epochs, sizes.train_tokens)],
                {str(n): (data_dir, n) for n in sizes.tokens_read}, str(sizes.train_tokens))


def probe_trial(work, sizes):
    """The probe's curriculum and test lengths (each length's documents prepared once), from a
    fresh backbone: the probe needs no language."""
    lengths = sorted({n for n, _ in sizes.probe_stages} | set(sizes.probe_test_lengths))
    dirs = {n: prepare_probe_data(work, n, sizes) for n in lengths}
    whole = {n: n + 1 for n in lengths}  # <eod> first: the first byte is token 1
    stages = [(dirs[n], epochs, whole[n]) for n, epochs in sizes.probe_stages]
    return Trial("probe", stages, {str(n): (dirs[n], whole[n]) for n in sizes.probe_test_lengths},
                str(sizes.probe_stages[-1][0]), by="by_length")


def run_experiment(work, sizes, stdlib_root=None, log=print, save=None):
    """The whole run (the benchmark or the demo) at `sizes`; returns the results dict (also
    handed to `save` after the stdlib task)."""
    start = time.perf_counter()
    lm_data, cls_data, data_summary = prepare_stdlib_data(work, sizes, stdlib_root, log)
    results = {"sizes": dataclasses.asdict(sizes), "data": data_summary}
    lm_model_dir = None
    if sizes.lm_steps:
        lm_model_dir = os.path.join(work, "lm")
        results["pretraining"] = pretrain(lm_data, lm_model_dir, sizes, log)
    results["stdlib"] = run_trial(stdlib_trial(cls_data, sizes), sizes, lm_model_dir, log)
    if save:
        save(results)  # a later failure keeps what was measured
    if sizes.probe_train:
        probe_sizes = dataclasses.replace(sizes, pooling=sizes.probe_pooling,
                                          grad_segments=sizes.probe_grad_segments)
        results["probe"] = run_trial(probe_trial(work, probe_sizes), probe_sizes, None, log)
    results["seconds"] = time.perf_counter() - start
    return results
