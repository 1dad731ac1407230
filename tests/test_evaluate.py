"""Evaluator.evaluate (key/value memory, position keys once per pass) against the same evaluation
done by hand, segment by segment, on the layer-input memory path."""

import io

import numpy as np
import pytest
import tensorflow as tf

import factories
from tfxl.data import pipeline
from tfxl.data.prepare import PrepareConfig, prepare
from tfxl.data.rechunk import rechunk
from tfxl.layers.memory import KeyValueRing
from tfxl.train.backends import configure_process
from tfxl.train.loop.evaluator import EvalProgress
from tfxl.train.tasks.language_model import make_evaluator

T = 8          # segment length of the data
STREAMS = 4
BATCHES = 10   # evaluated batches: several host loops of 3 steps


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    rng = np.random.default_rng(0)
    for split, blocks in (("train", 40), ("valid", 40), ("test", 10)):
        # Repeated random blocks: the loss depends on what the memory holds.
        text = np.repeat(rng.choice(np.frombuffer(b"abcdefgh", np.uint8), (blocks, T)), 3, 0)
        (root / f"{split}.txt").write_bytes(text.tobytes())
    out = root / "data"
    prepare(PrepareConfig(output_dir=str(out), train=[str(root / "train.txt")],
                          valid=[str(root / "valid.txt")], test=[str(root / "test.txt")],
                          tokenizer="bytes", tgt_len=T, num_streams=STREAMS), log=lambda *a: None)
    return str(out)


def make_test_evaluator(data_dir, model_dir, strategy, jit_compile):
    vocab_size = pipeline.load_manifest(data_dir)["vocab_size"]
    # A large init_std: predictions far from uniform, so the mean loss moves with every key.
    config = factories.tiny_config(vocab_size=vocab_size, d_model=32, d_head=16, d_inner=64,
                                   tgt_len=T, mem_len=T, init_std=0.3)
    configure_process(mixed_precision="float32", seed=0)  # as tfxl-eval does
    return make_evaluator(config, strategy, data_dir, str(model_dir), STREAMS,
                          jit_compile=jit_compile, steps_per_loop=3)


def by_hand(evaluator, data_dir, tgt_len, mem_len, clamp_len, same_length):
    """A function giving the mean NLL of the first BATCHES segments on the layer-input memory
    path with the evaluator's current weights; its step is traced once (the same shapes at every
    segment and call) and its input built once."""
    dataset = pipeline.input_fn("valid", pipeline.InputParams(data_dir=data_dir,
                                                              batch_size=STREAMS))
    if tgt_len != T:
        dataset = rechunk(dataset, tgt_len)
    lm = evaluator.model

    @tf.function
    def step(features, memory):
        nll, memory = lm(features["inputs"], memory, reset=features["reset"],
                         targets=features["targets"], clamp_len=clamp_len,
                         same_length=same_length)
        mask = tf.cast(features["target_mask"], nll.dtype)
        return tf.reduce_sum(nll * mask), tf.reduce_sum(mask), memory

    def evaluate():
        memory, total, count = lm.init_memory(STREAMS, mem_len=mem_len), 0.0, 0.0
        for features in dataset.take(BATCHES):
            nll_sum, tokens, memory = step(features, memory)
            total += float(nll_sum)
            count += float(tokens)
        return total / count

    return evaluate


SETTINGS = {
    "training settings": dict(tgt_len=T, mem_len=T, clamp_len=-1, same_length=False),
    "longer memory, re-cut, same_length, clamp": dict(tgt_len=T // 2, mem_len=3 * T,
                                                      clamp_len=5, same_length=True),
}


# Every pair of (strategy, settings, XLA) values once: the 2x2x2 grid's orthogonal half.
@pytest.mark.large
@pytest.mark.parametrize("strategy_name,settings,jit_compile", [
    ("default", "training settings", False),
    ("default", "longer memory, re-cut, same_length, clamp", True),
    ("mirrored", "training settings", True),
    ("mirrored", "longer memory, re-cut, same_length, clamp", False),
], ids=["default-training-eager", "default-longer-xla", "mirrored-training-xla",
        "mirrored-longer-eager"])
def test_evaluate_equals_the_layer_input_path_by_hand(data_dir, tmp_path, mirrored,
                                                      strategy_name, settings, jit_compile):
    strategy = mirrored if strategy_name == "mirrored" else tf.distribute.get_strategy()
    evaluator = make_test_evaluator(data_dir, tmp_path, strategy, jit_compile)
    # Checked as a training run checks it: its three passes below read one input, built once.
    evaluator.data.check_splits("valid")
    kwargs = SETTINGS[settings]
    evaluate_by_hand = by_hand(evaluator, data_dir, **kwargs)
    no_memory = evaluator.evaluate("valid", max_batches=BATCHES, **{**kwargs, "mem_len": 0})
    for weights_scale in (1.0, 1.5):
        # The second pass runs with other weights: its position keys must be recomputed.
        for variable in evaluator.model.trainable_variables:
            variable.assign(variable * weights_scale)
        got = evaluator.evaluate("valid", max_batches=BATCHES, **kwargs)
        want = evaluate_by_hand()
        assert got["loss"] == pytest.approx(want, abs=1e-5), weights_scale
    assert got["tokens"] == BATCHES * STREAMS * kwargs["tgt_len"]
    # The memory matters here (so the comparison above tests it), and it is a key/value ring.
    assert abs(no_memory["loss"] - got["loss"]) > 1e-2
    ring = evaluator.memories[(STREAMS, kwargs["tgt_len"], kwargs["mem_len"])].variables
    assert isinstance(ring, KeyValueRing)
    assert ring.valid.shape[1] == kwargs["mem_len"]
    assert ring.keys[0].shape[1:] == (2, 16, KeyValueRing.ring_size(kwargs["mem_len"],
                                                                  kwargs["tgt_len"]))


def test_the_loss_by_position_is_the_mean_at_each_position_of_the_segments(data_dir, tmp_path):
    evaluator = make_test_evaluator(data_dir, tmp_path, tf.distribute.get_strategy(), False)
    settings = SETTINGS["longer memory, re-cut, same_length, clamp"]
    got = evaluator.evaluate("valid", max_batches=BATCHES, by_position=True, **settings)
    dataset = rechunk(pipeline.input_fn("valid", pipeline.InputParams(
        data_dir=data_dir, batch_size=STREAMS)), settings["tgt_len"])
    memory = evaluator.model.init_memory(STREAMS, mem_len=settings["mem_len"])
    total = np.zeros(settings["tgt_len"])
    for features in dataset.take(BATCHES):  # every target is real here: no padding
        nll, memory = evaluator.model(features["inputs"], memory, reset=features["reset"],
                                      targets=features["targets"],
                                      clamp_len=settings["clamp_len"],
                                      same_length=settings["same_length"])
        total += nll.numpy().sum(axis=0)
    want = total / (BATCHES * STREAMS)
    np.testing.assert_allclose(got["loss_by_position"], want, atol=1e-5)
    assert np.mean(got["loss_by_position"]) == pytest.approx(got["loss"], abs=1e-6)
    assert "loss_by_position" not in evaluator.evaluate("valid", max_batches=2, **settings)


def test_evaluation_builds_no_optimizer_and_no_training_memory(data_dir, tmp_path):
    """What tfxl-eval builds: the model's weights and the evaluation state, nothing else."""
    created = []

    def record(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        created.append(variable)
        return variable

    with tf.variable_creator_scope(record):
        evaluator = make_test_evaluator(data_dir, tmp_path, tf.distribute.get_strategy(), False)
        evaluator.evaluate("valid", max_batches=2)
    weights = {id(v.value) for v in evaluator.model.variables}  # with the dropout seeds
    others = [v.name for v in created if id(v) not in weights]
    assert weights <= {id(v) for v in created}
    assert others and all(name.startswith(("eval_memory_", "eval_position_keys_"))
                          for name in others), others


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("stream,visible,shown", [
    (io.StringIO, None, False),   # a log file or pipe: quiet
    (Terminal, None, True),       # a terminal
    (Terminal, False, False),     # forced off
    (io.StringIO, True, True),    # forced on
])
def test_the_evaluation_progress_bar_shows_on_a_terminal_only(data_dir, tmp_path, stream,
                                                              visible, shown):
    evaluator = make_test_evaluator(data_dir, tmp_path, tf.distribute.get_strategy(), False)
    out = stream()
    evaluator.progress = EvalProgress(visible, stream=out)
    evaluator.evaluate("valid", max_batches=BATCHES)
    if shown:  # steps done of all, and the time per step
        assert f"{BATCHES}/{BATCHES}" in out.getvalue() and "/step" in out.getvalue()
    else:
        assert out.getvalue() == ""


def test_settings_follow_the_one_rule_given_else_eval_fields_else_training(data_dir, tmp_path):
    """Evaluator.settings (what `tfxl-train --eval_every` evaluates with) resolves as
    TransfoXLConfig.eval_settings: the given value, else eval_*, else the training value."""
    vocab_size = pipeline.load_manifest(data_dir)["vocab_size"]
    config = factories.tiny_config(vocab_size=vocab_size, tgt_len=T, mem_len=T, eval_mem_len=12,
                                   eval_same_length=True)
    configure_process(mixed_precision="float32", seed=0)
    evaluator = make_evaluator(config, tf.distribute.get_strategy(), data_dir,
                               str(tmp_path / "m"), STREAMS, steps_per_loop=3)
    assert evaluator.settings() == dict(batch_size=STREAMS, tgt_len=T, mem_len=12, clamp_len=-1,
                                        same_length=True)
    assert evaluator.settings(mem_len=3, tgt_len=4) == dict(
        batch_size=STREAMS, tgt_len=4, mem_len=3, clamp_len=-1, same_length=True)
    result = evaluator.evaluate("valid", max_batches=2)
    assert (result["mem_len"], result["same_length"]) == (12, True)


def test_a_newer_checkpoint_without_its_index_is_named_when_skipped(tmp_path):
    """tfxl-eval (restore_weights) passes over a newer checkpoint whose .index was deleted saying
    so, as over a damaged one. Prefixes without an index alone are no checkpoint (a first save
    killed before its index): the trainer starts from scratch, tfxl-eval finds none."""
    from tfxl.checkpoints.finding import newest_readable_checkpoint
    from tfxl.checkpoints.tree import restore_weights
    model = factories.tiny_lm()
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(tmp_path), 3)
    older, newest = manager.save(1), manager.save(2)
    (tmp_path / "ckpt-2.index").unlink()
    said = []
    assert restore_weights(model, directory=str(tmp_path), log=said.append) == older
    assert said == [f"skipping damaged checkpoint {newest}: its index ckpt-2.index is missing "
                    "(deleted, or its save has not finished)"]
    (tmp_path / "ckpt-1.index").unlink()
    said.clear()
    assert newest_readable_checkpoint(str(tmp_path), log=said.append) is None
    assert [line.split(": ")[0] for line in said] == [
        f"skipping damaged checkpoint {newest}", f"skipping damaged checkpoint {older}"]
    with pytest.raises(ValueError, match="no checkpoint in "):
        restore_weights(model, directory=str(tmp_path), log=said.append)


def test_a_checked_split_is_built_once_for_every_evaluation_pass(data_dir):
    """DistributedData keeps a checked split's evaluation input (each pass iterates it from its
    first batch) rather than tracing its tf.data functions again at every pass; an unchecked
    split is built, its shards' sizes verified, at every pass; training input always."""
    from tfxl.train.tasks.datasets import DistributedData

    data = DistributedData(tf.distribute.get_strategy(), data_dir,
                           pipeline.load_manifest(data_dir))
    assert data.dataset("valid", STREAMS, False) is not data.dataset("valid", STREAMS, False)
    data.check_splits("valid")
    first = data.dataset("valid", STREAMS, False)
    assert data.dataset("valid", STREAMS, False) is first
    assert data.dataset("valid", STREAMS, False, tgt_len=T // 2) is not first
    assert data.dataset("valid", 2, False) is not first
    assert data.dataset("valid", STREAMS, True) is not data.dataset("valid", STREAMS, True)
    passes = [[b["inputs"].numpy() for b in first] for _ in range(2)]
    assert len(passes[0]) > 1
    np.testing.assert_array_equal(np.stack(passes[0]), np.stack(passes[1]))


def test_a_missing_model_dir_is_named_as_tfxl_train_names_a_missing_data_dir(data_dir, tmp_path):
    missing = tmp_path / "no_such_run"
    factories.assert_one_error_line(
        factories.run_in_process("tfxl.train.evaluate", f"--data_dir={data_dir}",
                                 f"--model_dir={missing}"),
        f"--model_dir={missing} does not exist")
    assert not missing.exists()
