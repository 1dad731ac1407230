"""tfxl-classify-train: a DocumentClassifier trained the tfxl way (train/tasks/classification.py on
train/loop/run.py's TrainingRun): the loss falls, a stopped run resumes bitwise, a changed setting
is refused, a language model's backbone is the start, MirroredStrategy equals one device, the logged
evaluation is evaluate_classifier's, and bad input is one error line."""

import json
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from factories import (assert_one_error_line, fast_lease, run_in_process, tiny_config,
                       trained_model_dir_fixtures, vocab_size_of)
from tfxl import TransfoXLLM
from tfxl.classification import evaluate_classifier
from tfxl.data.classification import (ClassificationConfig, classification_dataset,
                                      load_classification_manifest, prepare_classification)
from tfxl.checkpoints.loading import load_language_model
from tfxl.train.backends import configure_process
from tfxl.train.tasks.classification import ClassificationTask, DocumentData
from tfxl.train.loop.optimization import OptimizerParams
from tfxl.train.loop.run import RunOptions, TrainingRun
from tfxl.train.tasks.task import Task
from tfxl.train.records.train_log import read_train_log

TOOL = "tfxl.train.classify_main"
# The backbone of every run here (the data's vocabulary is added): factories' tiny model.
BACKBONE = dict(n_layer=2, d_model=16, n_head=2, d_head=6, d_inner=24, dropout=0.1, dropatt=0.0,
                tgt_len=4, mem_len=4, init_std=0.2)


HEAD = {"num_classes": 2, "pooling": "last", "grad_segments": 1, "head_dropout": 0.0}


def documents(count, seed):
    """Learnable: a document of label x is mostly "a", of y mostly "b" (3 to 13 bytes)."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        label = "xy"[i % 2]
        text = "".join(rng.choice(list("ab"[i % 2] * 3 + "c"), rng.integers(3, 14)))
        yield {"text": text, "label": label}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("classify_train")
    for split, count in (("train", 24), ("valid", 6)):
        (root / f"{split}.jsonl").write_text("".join(
            json.dumps(d) + "\n" for d in documents(count, seed=len(split))))
    prepare_classification(ClassificationConfig(
        output_dir=str(root / "data"), train=[str(root / "train.jsonl")],
        valid=[str(root / "valid.jsonl")], valid_fraction=0.0, test_fraction=0.0),
        log=lambda *a: None)
    (root / "backbone.json").write_text(json.dumps(BACKBONE))
    return str(root / "data")


def flags_for(data_dir, model_dir, steps, *more):
    config = str(data_dir).replace("/data", "/backbone.json")
    return (f"--data_dir={data_dir}", f"--model_dir={model_dir}", f"--config={config}",
            f"--train_steps={steps}", "--schedule_steps=12", "--train_batch_size=4",
            "--steps_per_loop=2", "--learning_rate=0.01", "--clip=1", "--lease_settle=0",
            "--train_log_seconds=0", *more)


def train(data_dir, model_dir, steps, *more):
    done = run_in_process(TOOL, *flags_for(data_dir, model_dir, steps, *more))
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def classifier_weights(model_dir):
    return keras.saving.load_model(model_dir / "classifier.keras").get_weights()


@pytest.fixture(scope="module")
def uninterrupted(data_dir, tmp_path_factory):
    """12 steps (two passes over the 24 documents), evaluated on valid at the end."""
    model_dir = tmp_path_factory.mktemp("uninterrupted") / "m"
    done = train(data_dir, model_dir, 12, "--eval_every=12")
    return model_dir, done


trained_to_5, trained_copy = trained_model_dir_fixtures(train, steps=5)


def test_the_loss_falls_on_a_learnable_set(uninterrupted):
    model_dir, done = uninterrupted
    losses = [record["loss"] for record in read_train_log(model_dir)]
    assert len(losses) == 12
    # From around chance (ln 2 = 0.69 for two labels) to far below it.
    assert np.mean(losses[:4]) > 0.5 and np.mean(losses[-4:]) < 0.25, losses
    assert "done: step 12" in done.stdout and "classifier.keras" in done.stdout


def test_the_logged_evaluation_is_evaluate_classifiers(uninterrupted, data_dir):
    model_dir, done = uninterrupted
    logged = json.loads((model_dir / "metrics.json").read_text())["valid"]
    model = keras.saving.load_model(model_dir / "classifier.keras")
    longest = json.loads(open(f"{data_dir}/manifest.json").read())["splits"]["valid"][
        "max_length"]  # every document whole, padded to the longest (static shapes)
    want = evaluate_classifier(model, classification_dataset(
        data_dir, "valid", 4, 4, max_tokens=longest, pad_to_max_tokens=True), 4)
    assert logged["documents"] == 6 and logged["confusion"] == want.confusion.tolist()
    assert logged["loss"] == pytest.approx(want.loss, abs=1e-6)
    assert logged["accuracy"] == want.accuracy and logged["macro_f1"] == want.macro_f1
    scalars = {value.tag: float(tf.make_ndarray(value.tensor))
               for path in tf.io.gfile.glob(str(model_dir / "train" / "events.*"))
               for event in tf.compat.v1.train.summary_iterator(path)
               for value in event.summary.value}
    assert scalars["valid_accuracy"] == pytest.approx(want.accuracy)
    assert scalars["valid_macro_f1"] == pytest.approx(want.macro_f1)
    assert scalars["valid_loss"] == pytest.approx(want.loss, abs=1e-6)
    assert "documents_per_second" in scalars
    assert f"valid loss {want.loss:.4f}, accuracy {want.accuracy:.4f}" in done.stderr
    # The same command again: nothing to do, the results of the run that trained kept.
    metrics = (model_dir / "metrics.json").read_bytes()
    again = train(data_dir, model_dir, 12, "--eval_every=12")
    assert "nothing to do" in again.stdout and (model_dir / "metrics.json").read_bytes() == metrics


@pytest.mark.large
def test_stopped_and_resumed_equals_uninterrupted_bitwise(uninterrupted, trained_copy, data_dir):
    """Stopped at step 5 (in the first pass), resumed to 12 (across the reshuffled second pass,
    dropout on): every weight equal to the uninterrupted run's, bit for bit."""
    train(data_dir, trained_copy, 12)  # no evaluation: it changes no weight
    for resumed, reference in zip(classifier_weights(trained_copy),
                                  classifier_weights(uninterrupted[0])):
        np.testing.assert_array_equal(resumed, reference)
    steps = [record["step"] for record in read_train_log(trained_copy)]
    assert steps == list(range(1, 13))


def test_a_changed_setting_is_refused_in_one_line(trained_copy, data_dir):
    before = {p.name: p.read_bytes() for p in trained_copy.iterdir() if p.is_file()}
    for changed, needles in (("--learning_rate=0.02", ("learning_rate: run.json has 0.01",)),
                             ("--pooling=last_segment_mean", ("pooling: run.json has 'last'",)),
                             ("--grad_segments=2", ("grad_segments",)),
                             ("--reading=no_memory", ("reading: run.json has 'memory'",)),
                             ("--tgt_len=8", ("holds a different model", "tgt_len"))):
        assert_one_error_line(run_in_process(TOOL, *flags_for(data_dir, trained_copy, 12,
                                                              changed)), *needles)
    assert {p.name: p.read_bytes() for p in trained_copy.iterdir() if p.is_file()} == before


def classifier_run(config, model_dir, optimizer, *, data_dir, strategy=None, log=print,
                   **task_options):
    """A `TrainingRun` of the classification task, as tfxl-classify-train builds it (a batch of
    4 documents)."""
    task = ClassificationTask(config, data_dir=data_dir, head=HEAD, **task_options)
    configure_process(mixed_precision="float32", seed=0)
    return TrainingRun(task, strategy=strategy or tf.distribute.get_strategy(),
                       options=RunOptions(model_dir=str(model_dir), global_batch=4,
                                          optimizer=optimizer, lease=fast_lease()),
                       log=log)


def test_a_language_model_is_the_starting_backbone(data_dir, tmp_path):
    """A language model's .keras file read as --init_checkpoint reads it: the classifier starts
    from its backbone (the head fresh); with checkpoints in the model_dir it is ignored."""
    keras.utils.set_random_seed(7)
    lm = TransfoXLLM(tiny_config(**{**BACKBONE, "vocab_size": vocab_size_of(data_dir)}))
    lm.build((None, 4))
    lm.save(tmp_path / "lm.keras")
    language_model = load_language_model(str(tmp_path / "lm.keras"))
    said = []
    run = classifier_run(language_model.config, tmp_path / "m", OptimizerParams(train_steps=1),
                         data_dir=data_dir, language_model=language_model,
                         init_checkpoint="lm.keras", log=said.append)
    for ours, theirs in zip(run.model.backbone.get_weights(), lm.backbone.get_weights()):
        np.testing.assert_array_equal(ours, theirs)
    assert said == ["warm start: backbone weights from lm.keras (head, optimizer and step start "
                    "fresh)"] and run.init_checkpoint == "lm.keras"
    fresh = classifier_run(language_model.config, tmp_path / "fresh",
                           OptimizerParams(train_steps=1), data_dir=data_dir)
    assert not np.array_equal(fresh.model.backbone.get_weights()[0],
                              lm.backbone.get_weights()[0])


@pytest.mark.large
def test_mirrored_equals_one_device_for_one_step(data_dir, mirrored, tmp_path):
    """One step on two replicas (2 logical CPUs, 2 documents each) equals one on one device to
    1e-5; the step changed the weights. Documents cut to 8 tokens: two segments, the first read
    in the loop without gradient (a shorter trace). Not XLA-compiled: that doubled the test's
    time (the trainer's --jit_compile path is tfxl-train's, tested there)."""
    # No dropout: the replicas draw their own masks.
    config = tiny_config(**{**BACKBONE, "vocab_size": vocab_size_of(data_dir), "dropout": 0.0})
    weights = []
    for name, strategy in (("one", tf.distribute.get_strategy()), ("two", mirrored)):
        run = classifier_run(config, tmp_path / name,
                             OptimizerParams(learning_rate=0.01, train_steps=1, clip=1.0),
                             data_dir=data_dir, strategy=strategy, max_tokens=8)
        initial = run.model.get_weights()
        run.train_step.train(1)
        weights.append(run.model.get_weights())
    for one, two in zip(*weights):
        np.testing.assert_allclose(one, two, atol=1e-5)
    assert all(not np.array_equal(a, b) for a, b in zip(initial, weights[1]))


def test_each_host_reads_its_own_replicas_share_of_one_stream(data_dir):
    """Multi-host input: with 2 input pipelines of 2 replicas each, pipeline p's batches are
    those of replicas 2p and 2p + 1 in the one stream a single pipeline reads; a resumed
    stream (skip 1 step) is that stream one step on. Every shape is static (XLA, TPUs)."""
    data = DocumentData(None, data_dir, load_classification_manifest(data_dir), 4, seed=3)

    def batches(pipelines, pipeline, count, skip=0):
        context = tf.distribute.InputContext(pipelines, pipeline, num_replicas_in_sync=4)
        return [features["token_ids"].numpy() for features, _ in
                data.replica_batches(context, 8, skip).take(count)]

    one = batches(1, 0, 12)  # 3 steps of 4 replicas' batches of 2 documents
    spec = data.replica_batches(tf.distribute.InputContext(), 8).element_spec
    assert all(x.shape.is_fully_defined() for x in tf.nest.flatten(spec)), spec  # one trace
    for host in (0, 1):
        mine = [one[step * 4 + 2 * host + j] for step in range(3) for j in (0, 1)]
        for got, want in zip(batches(2, host, 6), mine, strict=True):
            np.testing.assert_array_equal(got, want)
    for got, want in zip(batches(1, 0, 8, skip=1), one[4:], strict=True):
        np.testing.assert_array_equal(got, want)


def test_bad_flags_and_files_are_one_error_line_and_nothing_is_written(data_dir, tmp_path):
    model_dir = tmp_path / "m"
    lm_data = tmp_path / "lm_data"
    lm_data.mkdir()
    shutil.copy(f"{data_dir}/manifest.json", lm_data / "manifest.json")
    manifest = json.loads((lm_data / "manifest.json").read_text())
    del manifest["kind"]  # a language model's manifest
    (lm_data / "manifest.json").write_text(json.dumps(manifest))
    lm = TransfoXLLM(tiny_config(vocab_size=vocab_size_of(data_dir), d_model=8, d_head=4))
    lm.build((None, 4))
    lm.save(tmp_path / "small.keras")
    for args, needles in (
            (("--grad_segments=0",), ("--grad_segments=0", "out of range")),
            (("--head_dropout=1.5",), ("--head_dropout=1.5", "in [0, 1)")),
            (("--pooling=max",), ("pooling",)),
            ((f"--data_dir={lm_data}",), ("classification",)),
            ((f"--init_checkpoint={tmp_path}/none.keras",), ("--init_checkpoint=",
                                                               "none.keras")),
            ((f"--init_checkpoint={tmp_path}/small.keras", "--d_model=16", "--d_head=6"),
             ("does not fit the backbone",))):
        assert_one_error_line(run_in_process(TOOL, *flags_for(data_dir, model_dir, 2, *args)),
                              *needles)
    assert_one_error_line(run_in_process(TOOL, f"--model_dir={model_dir}"),
                          "--data_dir is required")
    assert not model_dir.exists()


def test_dry_run_prints_the_plan_and_writes_nothing(data_dir, tmp_path):
    model_dir = tmp_path / "m"
    done = run_in_process(TOOL, *flags_for(data_dir, model_dir, 12, "--dry_run",
                                           "--grad_segments=2", "--max_tokens=8"))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("plan: ") and "2 classes, last pooling" in lines[0], lines
    # --max_tokens=8: two segments of tgt_len 4, the last two read with gradient.
    assert ("4 documents per step of 8 tokens (2 segments of tgt_len 4, the last 2 with "
            "gradient; mem_len 4)") in lines[0], lines
    assert lines[1].startswith("memory per replica (estimate): ") and "checkpoint" not in lines[2]
    assert lines[2].startswith("memory: ") and lines[-1] == "dry run: nothing written", lines
    assert not model_dir.exists()


def test_a_size_no_machine_holds_is_refused_before_anything_is_written(data_dir, tmp_path):
    model_dir = tmp_path / "m"
    refused = run_in_process(TOOL, *flags_for(data_dir, model_dir, 2, "--memory_limit_gib=0.001"))
    assert_one_error_line(refused, "the estimated memory", "exceeds", "--grad_segments (1)",
                          "--ignore_memory_estimate")
    assert not model_dir.exists()
    anyway = run_in_process(TOOL, *flags_for(data_dir, model_dir, 1, "--memory_limit_gib=0.001",
                                             "--ignore_memory_estimate"))
    assert anyway.returncode == 0, anyway.stderr[-3000:]
    assert "training anyway (--ignore_memory_estimate)" in anyway.stdout


def test_progress_shows_from_the_first_steps(data_dir, tmp_path):
    """In a log (stdout not a terminal) one line per host loop, the first loops ending 1, 2, 4,
    ... steps in: the first line comes after step 1, not after --steps_per_loop steps."""
    done = train(data_dir, tmp_path / "m", 6, "--steps_per_loop=100")
    progress = [line.split(":")[0] for line in done.stdout.splitlines()
                if line.startswith("step ")]
    assert progress == ["step 1/6", "step 2/6", "step 4/6", "step 6/6"], done.stdout
    assert " documents/s" in done.stdout


class Incomplete(Task):  # leaves `loss` undefined
    def load_data(self, strategy, *, model_dir, seed): ...
    def build_model(self, strategy): ...
    def initial_memory(self, model, rows): ...
    def batch_weight(self, batch): ...
    def check_data(self, data, *, global_batch, evaluates): ...
    def claim_model_dir(self, model_dir, data): ...
    def build_evaluator(self, model, strategy, data, **options): ...
    def evaluate(self, evaluator, data, split="valid", **settings): ...


def test_a_task_without_every_abstract_method_cannot_be_made():
    with pytest.raises(TypeError, match="abstract method.*loss"):
        Incomplete(tiny_config(), data_dir="unused")


def test_the_two_tasks_train_under_the_same_training_run(data_dir, tmp_path):
    """The language model's task and the classifier's, each one step of the one TrainingRun:
    metrics.json written by the same code, counted in each task's unit."""
    from factories import data_config, random_bytes_data
    from tfxl.train.tasks.language_model import LanguageModelTask
    (tmp_path / "lm").mkdir()
    lm_data = random_bytes_data(tmp_path / "lm", 4, 4)
    tasks = [LanguageModelTask(data_config(lm_data, tgt_len=4), data_dir=lm_data),
             ClassificationTask(tiny_config(**{**BACKBONE, "vocab_size": vocab_size_of(data_dir)}),
                                data_dir=data_dir, head=HEAD, max_tokens=8)]
    for task in tasks:
        assert isinstance(task, Task)
        model_dir = tmp_path / type(task).__name__
        configure_process(mixed_precision="float32", seed=0)
        run = TrainingRun(task, strategy=tf.distribute.get_strategy(),
                          options=RunOptions(model_dir=str(model_dir), global_batch=4,
                                             optimizer=OptimizerParams(train_steps=1),
                                             lease=fast_lease()))
        metrics = run.train(log=lambda *a: None)
        assert metrics["step"] == 1 and np.isfinite(metrics["train_loss"])
        assert json.loads((model_dir / "metrics.json").read_text())["step"] == 1
        assert f"train_{task.unit}_per_second" in metrics
    assert [task.unit for task in tasks] == ["tokens", "documents"]


def test_segment_attention_on_one_segment_per_document_trains(data_dir, tmp_path):
    # The truncation baseline (--max_tokens = --tgt_len, one segment): the query's gradient is
    # zero, not None, which stopped the run ("None values not supported").
    model_dir = tmp_path / "m"
    done = train(data_dir, model_dir, 2, "--pooling=segment_attention", "--grad_segments=1",
                 "--max_tokens=4")
    assert "done: step 2" in done.stdout


def test_the_reading_is_saved_with_the_classifier(data_dir, tmp_path):
    # tfxl-classify-eval and tfxl-export read as the run trained: the classifier carries it.
    train(data_dir, tmp_path / "t", 2, "--reading=truncation", "--pooling=segment_attention")
    model = keras.saving.load_model(tmp_path / "t" / "classifier.keras")
    assert (model.reading, model.max_tokens, model.tokens_read) == ("truncation", 4, 4)
    train(data_dir, tmp_path / "n", 2, "--reading=no_memory", "--max_tokens=8")
    model = keras.saving.load_model(tmp_path / "n" / "classifier.keras")
    assert (model.reading, model.max_tokens) == ("no_memory", 8)
    record = json.loads((tmp_path / "n" / "run.json").read_text())["settings"]
    assert record["reading"] == "no_memory" and record["max_tokens"] == 8


def test_evaluation_inside_a_run_reads_a_bounded_number_of_tokens(data_dir):
    manifest = load_classification_manifest(data_dir)
    longest = {s: manifest["splits"][s]["max_length"] for s in ("train", "valid")}

    def data(**kwargs):
        return DocumentData(None, data_dir, manifest, 4, **kwargs)
    assert data().length("valid") == longest["train"]  # as training reads
    assert data(max_tokens=6).length("valid") == 6
    assert data(max_tokens=6, eval_max_tokens=3).length("valid") == 3
    assert data(max_tokens=6, eval_max_tokens=0).length("valid") == longest["valid"]  # whole
