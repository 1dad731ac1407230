"""Faults a user can cause on the trainer side: each ends in one `error:` line (exit 2) or is
recovered from, and nothing already written is overwritten or lost."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

import factories
from factories import assert_one_error_line, run_in_process
from tfxl.checkpoints.loading import load_language_model
from tfxl.train import flags as train_flags
from tfxl.checkpoints.tree import restore_weights
from tfxl.train.tasks.language_model import build_model
from tfxl.model_dir import check_or_store_config
from tfxl.train.loop.optimization import OptimizerParams
from tfxl.train.records.train_log import read_train_log

T = 8          # segment length of the test data
STREAMS = 4    # streams per split


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return factories.random_bytes_data(tmp_path_factory.mktemp("faults"), T, STREAMS)


def train(data_dir, model_dir, steps, save_every=10, eval_every=None, **config):
    """A TrainingRun trained to `steps`; returns (runner, metrics, log lines)."""
    messages = []
    config = factories.data_config(data_dir, **config)
    check_or_store_config(str(model_dir), config)  # what tfxl-train does
    runner = factories.language_model_run(
        config, data_dir=data_dir, model_dir=str(model_dir), global_batch=STREAMS,
        optimizer=OptimizerParams(learning_rate=3e-3, train_steps=steps, min_lr_ratio=1.0),
        steps_per_loop=5, lease=factories.fast_lease())
    metrics = runner.train(save_every=save_every, eval_every=eval_every, max_eval_batches=2,
                           log=messages.append)
    return runner, metrics, messages


def logged_losses(model_dir):
    return {r["step"]: r["loss"] for r in read_train_log(str(model_dir))}


def damage(prefix, how):
    """Damages the checkpoint files of `prefix` (.../ckpt-N) the way `how` says."""
    data, index = f"{prefix}.data-00000-of-00001", f"{prefix}.index"
    if how == "truncated":
        os.truncate(data, os.path.getsize(data) // 2)
    elif how == "garbage_data":
        with open(data, "r+b") as f:
            f.seek(os.path.getsize(data) // 3)
            f.write(os.urandom(64))
    elif how == "garbage_index":
        with open(index, "r+b") as f:
            f.write(os.urandom(os.path.getsize(index)))




# -- 1. damaged checkpoints -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def straight_losses(data_dir, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("straight") / "m"
    train(data_dir, model_dir, 30)
    return logged_losses(model_dir)


# A model_dir trained to step 20 (checkpoints 10 and 20), once; each test resumes a copy.
trained_to_20, trained_copy = factories.trained_model_dir_fixtures(train)


@pytest.mark.parametrize("how", ["truncated", "garbage_data", "garbage_index"])
def test_damaged_latest_checkpoint_is_skipped_and_training_resumes_exactly(
        data_dir, trained_copy, straight_losses, how):
    model_dir = trained_copy
    damage(str(model_dir / "checkpoints" / "ckpt-20"), how)
    _, _, messages = train(data_dir, model_dir, 30)
    skipped = [m for m in messages if "ckpt-20" in m]
    assert skipped and "damaged" in skipped[0], messages
    assert any("resumed from" in m and "ckpt-10" in m for m in messages), messages
    resumed = logged_losses(model_dir)
    assert sorted(resumed) == list(range(1, 31))
    for step in range(11, 31):  # continues from step 10 exactly (dropout on: RNG restored too)
        assert resumed[step] == pytest.approx(straight_losses[step], abs=1e-5), step


def test_damaged_checkpoint_is_named_by_eval_and_export(data_dir, tmp_path, trained_copy):
    model_dir = trained_copy
    latest = str(model_dir / "checkpoints" / "ckpt-20")
    damage(latest, "truncated")
    eval_flags = [f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--max_eval_batches=1"]
    # Falls back, saying what it skipped.
    result = run_in_process("tfxl.train.evaluate", *eval_flags)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.splitlines()[-1])["checkpoint"].endswith("ckpt-10")
    assert f"skipping damaged checkpoint {latest}" in result.stderr
    assert_one_error_line(run_in_process("tfxl.train.evaluate", *eval_flags,
                                         f"--checkpoint={latest}"), latest, "is damaged")
    assert_one_error_line(run_in_process("tfxl.serving.export_main", f"--model={model_dir}",
                                         f"--checkpoint={latest}",
                                         f"--output_dir={tmp_path / 'x'}"),
                          latest, "is damaged")
    assert not (tmp_path / "x").exists()
    # tfxl-export and tfxl-generate load through load_language_model: the same fallback.
    skipped = []
    model = load_language_model(str(model_dir), log=skipped.append)
    assert model.config.d_model == 16 and len(skipped) == 1 and latest in skipped[0]


def test_every_checkpoint_damaged_is_refused_and_nothing_is_overwritten(data_dir, trained_copy):
    model_dir = trained_copy
    for step in (10, 20):
        damage(str(model_dir / "checkpoints" / f"ckpt-{step}"), "garbage_data")
    before = {p: p.read_bytes() for p in model_dir.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match="no readable checkpoint .* every one is damaged"):
        train(data_dir, model_dir, 30)  # never silently starts again from step 0
    assert {p: p.read_bytes() for p in model_dir.rglob("*") if p.is_file()} == before


def test_intact_checkpoint_of_another_model_keeps_its_message(data_dir, trained_copy):
    model_dir = trained_copy  # intact checkpoints (10 and 20) of data_config's model
    other = build_model(factories.data_config(data_dir, d_model=32), tf.distribute.get_strategy())
    with pytest.raises(ValueError, match="does not fit this model") as raised:
        restore_weights(other, directory=str(model_dir / "checkpoints"))
    assert "damaged" not in str(raised.value)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "d_model": 32}))
    with pytest.raises(ValueError, match="does not fit") as raised:
        load_language_model(str(model_dir))
    assert "damaged" not in str(raised.value)


# -- 3. a refused first run claims nothing --------------------------------------------------------

def cli_flags(data_dir, model_dir, steps):
    return [f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--n_layer=1", "--d_model=16",
            "--n_head=2", "--d_head=8", "--d_inner=32", "--dropout=0.1", f"--tgt_len={T}",
            f"--mem_len={T}", f"--train_batch_size={STREAMS}", f"--train_steps={steps}",
            "--steps_per_loop=5", "--save_every=10", "--learning_rate=0.003",
            "--lease_settle=0"]  # one trainer per model_dir here: no settle to wait


def test_a_refused_first_run_leaves_no_config_behind(data_dir, tmp_path):
    model_dir = tmp_path / "m"
    for bad, needle in [(f"--tgt_len={2 * T}", "tgt_len mismatch"),
                        ("--train_batch_size=3", "global batch size 3")]:
        assert_one_error_line(run_in_process("tfxl.train.main",
                                             *cli_flags(data_dir, model_dir, 2), bad), needle)
        assert not (model_dir / "config.json").exists(), bad
        assert not (model_dir / "data.json").exists(), bad
    corrected = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, 2))
    assert corrected.returncode == 0, corrected.stderr[-2000:]
    assert (model_dir / "config.json").exists() and (model_dir / "data.json").exists()


# -- 9. numeric flags out of range ----------------------------------------------------------------

GOOD_FLAGS = dict(train_batch_size=4, train_steps=10, steps_per_loop=5, save_every=0,
                  eval_every=0, learning_rate=3e-3, warmup_steps=9, min_lr_ratio=1.0, clip=0.25,
                  weight_decay=0.0, seed=0, mem_len=0, clamp_len=-1, tgt_len=8, dropout=0.0)


@pytest.mark.parametrize("flag,value", [
    ("learning_rate", -1.0), ("learning_rate", 0.0), ("learning_rate", float("nan")),
    ("warmup_steps", 10), ("warmup_steps", -1), ("clip", 0.0), ("clip", -1.0),
    ("min_lr_ratio", 1.5), ("min_lr_ratio", -0.1), ("train_steps", 0), ("steps_per_loop", 0),
    ("train_batch_size", 0), ("eval_batch_size", -4), ("save_every", -1), ("eval_every", -1),
    ("max_eval_batches", 0), ("mem_len", -1), ("clamp_len", -2), ("tgt_len", 0),
    ("eval_tgt_len", 0), ("eval_mem_len", -1), ("eval_clamp_len", -5), ("dropout", 1.0),
    ("dropatt", -0.1), ("d_model", 0), ("weight_decay", -1.0), ("num_gpus", -1),
    ("schedule_steps", 9), ("lease_timeout", 0.0), ("lease_settle", -1.0),
    ("train_log_seconds", -1.0),
])
def test_a_numeric_flag_out_of_range_is_named(flag, value):
    train_flags.check_flag_ranges(GOOD_FLAGS)  # the edges themselves are allowed
    with pytest.raises(ValueError, match=rf"^--{flag}=\S+ is out of range: it must be"):
        train_flags.check_flag_ranges({**GOOD_FLAGS, flag: value})


@pytest.mark.parametrize("module", ["tfxl.train.main", "tfxl.train.evaluate"])
def test_every_numeric_flag_has_a_rule(module):
    """The tool's flags as its run() defines them, in this process (run_in_process's way: the
    flags it adds are removed afterwards): those tfxl defines, not absl's or TensorFlow's."""
    import importlib

    from absl import flags
    known = set(flags.FLAGS)
    importlib.import_module(module).define_flags()
    try:
        numeric = {f.name for name, defined in flags.FLAGS.flags_by_module_dict().items()
                   if name.startswith(("tfxl.train.", "tfxl.tpu.")) for f in defined
                   if f.flag_type() in ("int", "float") and f.name in flags.FLAGS}
    finally:
        for name in set(flags.FLAGS) - known:
            delattr(flags.FLAGS, name)
    assert "learning_rate" in numeric or module == "tfxl.train.evaluate", numeric
    assert numeric and numeric <= set(train_flags.FLAG_RULES), numeric - set(
        train_flags.FLAG_RULES)


def test_cli_refuses_a_negative_learning_rate_before_writing(data_dir, tmp_path):
    model_dir = tmp_path / "m"
    assert_one_error_line(run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, 2),
                                         "--learning_rate=-1"), "--learning_rate=-1")
    assert not model_dir.exists()
    assert_one_error_line(run_in_process("tfxl.train.evaluate", f"--data_dir={data_dir}",
                                         f"--model_dir={model_dir}", "--mem_len=-1"),
                          "--mem_len=-1")


# -- 5. a run with nothing to do keeps the results of the run that did the work ------------------

def test_a_finished_run_keeps_its_metrics_and_says_it_had_nothing_to_do(data_dir, tmp_path,
                                                                        straight_run_dir):
    # A copy of a finished run: tfxl-train's run of cli_flags to step 30 (straight_run_dir).
    model_dir = tmp_path / "m"
    shutil.copytree(straight_run_dir, model_dir)

    def written():
        return {p: p.read_bytes() for p in model_dir.rglob("*") if p.is_file()}

    kept = written()
    assert json.loads(kept[model_dir / "metrics.json"])["train_loss"] is not None
    again = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, 30))
    assert again.returncode == 0, again.stderr[-2000:]
    assert written() == kept  # the metrics, the log, everything
    assert "nothing to do" in again.stdout


@pytest.mark.large
def test_demo_run_twice_keeps_the_training_results(data_dir, tmp_path, monkeypatch):
    # The demo's steps without XLA: what is checked here (the results kept, the retracing hint
    # hidden) does not depend on it, and its compiles (one train step, one forward per memory
    # length) were two thirds of the test's CPU. test_train.py's
    # test_train_and_eval_steps_compile_as_one_xla_computation tests the XLA steps.
    from tfxl.train.loop import run as training_run
    options = training_run.RunOptions
    monkeypatch.setattr(training_run, "RunOptions",
                        lambda **fields: options(**{**fields, "jit_compile": False}))
    out = tmp_path / "demo"
    shutil.copytree(data_dir, out / "data")  # reused by the demo: no corpus to prepare
    args = [f"--out={out}", "--train_steps=2", f"--batch_size={STREAMS}", f"--eval_tgt_len={T}",
            "--eval_mem_lens=0,1,2,3,4"]
    first = run_in_process("tfxl.train.demo", *args)
    assert first.returncode == 0, first.stderr[-2000:]
    # Five memory lengths, five traced evaluation steps: by design, so TF's hint stays hidden.
    assert "retracing" not in first.stderr + first.stdout
    trained = json.loads((out / "results.json").read_text())["train"]
    assert trained["train_loss"] is not None and trained["step"] == 2
    # The second run needs no five memory lengths: what it keeps is the training's results.
    again = run_in_process("tfxl.train.demo", *args[:-1], "--eval_mem_lens=0")
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((out / "results.json").read_text())["train"] == trained
    assert "nothing to do" in again.stdout


# -- 15. evaluation settings: set by tfxl-train, reported by tfxl-eval ----------------------------

def test_tfxl_train_stores_eval_settings_and_tfxl_eval_says_where_each_came_from(data_dir,
                                                                                 tmp_path):
    model_dir = tmp_path / "m"
    trained = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, 2),
                             "--eval_tgt_len=4", "--eval_mem_len=16", "--eval_same_length")
    assert trained.returncode == 0, trained.stderr[-2000:]
    config = json.loads((model_dir / "config.json").read_text())
    assert (config["eval_tgt_len"], config["eval_mem_len"], config["eval_same_length"]) == (
        4, 16, True)
    evaluated = run_in_process("tfxl.train.evaluate", f"--data_dir={data_dir}",
                               f"--model_dir={model_dir}", "--mem_len=8", "--max_eval_batches=1")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    result = json.loads(evaluated.stdout)  # stdout is the result's JSON line only
    assert (result["tgt_len"], result["mem_len"], result["clamp_len"], result["same_length"]) == (
        4, 8, config["clamp_len"], True)
    assert result["settings_from"] == {
        "tgt_len": "config.json eval_tgt_len", "mem_len": "flag --mem_len",
        "clamp_len": "config.json clamp_len (training)",
        "same_length": "config.json eval_same_length"}
    assert "tgt_len=4 (config.json eval_tgt_len), mem_len=8 (flag --mem_len)" in evaluated.stderr


# -- 6. every split a run reads is checked before the first step ---------------------------------

@pytest.mark.parametrize("how", ["flipped", "truncated"])
def test_a_corrupt_valid_shard_stops_training_before_the_first_step(data_dir, tmp_path, how):
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    shard = sorted(data.glob("valid-stream-*"))[1]
    if how == "flipped":  # same size: only reading the records finds it
        raw = bytearray(shard.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        shard.write_bytes(bytes(raw))
    else:
        os.truncate(shard, shard.stat().st_size - 10)
    model_dir = tmp_path / "m"
    with pytest.raises(ValueError, match=rf"shard {shard}"):
        factories.language_model_run(
            factories.data_config(str(data)), data_dir=str(data), model_dir=str(model_dir),
            global_batch=STREAMS, optimizer=OptimizerParams(learning_rate=3e-3, train_steps=10),
            steps_per_loop=5, lease=factories.fast_lease()).train(save_every=5, eval_every=5)
    assert not model_dir.exists()  # no step, no checkpoint, no config.json


# -- 2. a run killed while it writes a checkpoint resumes from the previous one exactly -----------

@pytest.fixture(scope="module")
def straight_run_dir(data_dir, tmp_path_factory):
    """The model_dir of tfxl-train's uninterrupted run of cli_flags to step 30."""
    model_dir = tmp_path_factory.mktemp("straight") / "m"
    result = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, 30))
    assert result.returncode == 0, result.stderr[-2000:]
    return model_dir


@pytest.fixture(scope="module")
def straight_run(straight_run_dir):
    return logged_losses(straight_run_dir)


@pytest.mark.large
@pytest.mark.parametrize("module,function", [
    # ckpt-20's tensors are written into ckpt-20_temp/, not yet merged into place
    ("tensorflow.python.ops.gen_io_ops", "merge_v2_checkpoints"),
    # ckpt-20's files are in place, the `checkpoint` state file still names ckpt-10
    ("tensorflow.python.checkpoint.checkpoint_management", "update_checkpoint_state_internal"),
])
@pytest.mark.subprocess
def test_kill_9_during_a_save_resumes_exactly(data_dir, tmp_path, straight_run, module,
                                              function):
    model_dir, marker = tmp_path / "m", tmp_path / "in_save"
    proc = subprocess.Popen([sys.executable, "-c", factories.HANG_IN_SAVE, module, function,
                             "ckpt-20",
                             str(marker), *cli_flags(data_dir, model_dir, 30)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    factories.kill_9_in_the_save(proc, marker, timeout=240)
    resumed = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, 30))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stderr and "Traceback" not in resumed.stderr
    losses = logged_losses(model_dir)
    assert sorted(losses) == list(range(1, 31))
    for step in range(1, 31):  # dropout on: weights, optimizer and RNG all come back
        assert losses[step] == pytest.approx(straight_run[step], abs=1e-5), step


# -- 6. a model_dir path of the wrong kind is refused before anything changes --------------------

@pytest.mark.parametrize("name,kind", [("checkpoints", "file"), ("train_log", "file"),
                                       ("train", "file"), ("run.json", "directory")])
def test_a_model_dir_entry_of_the_wrong_kind_is_refused_before_anything_changes(
        data_dir, tmp_path, straight_run_dir, name, kind):
    # A finished run (logged to step 30) continued to 40, with one of its entries replaced.
    model_dir = tmp_path / "m"
    shutil.copytree(straight_run_dir, model_dir)
    entry = model_dir / name
    if entry.is_dir():
        shutil.rmtree(entry)
    else:
        entry.unlink()
    if kind == "file":
        entry.write_text("not a directory\n")
    else:
        entry.mkdir()
    paths = set(model_dir.rglob("*"))
    kept = {p: p.read_bytes() for p in paths if p.is_file()}
    result = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, 40))
    assert_one_error_line(result, str(entry), f"is a {kind}")
    assert "dropped steps" not in result.stdout + result.stderr
    assert set(model_dir.rglob("*")) == paths  # nothing added or removed
    assert {p: p.read_bytes() for p in paths if p.is_file()} == kept


def test_the_trainers_notes_are_plain_lines(data_dir, tmp_path, straight_run_dir):
    """What a run says about itself (resumed from, run settings, a lease taken over) is the tool's
    own line on stderr, not absl's log line with its date, thread and source file."""
    model_dir = tmp_path / "m"
    shutil.copytree(straight_run_dir, model_dir)
    result = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, 35))
    assert result.returncode == 0, result.stderr[-2000:]
    assert any(line.startswith(f"resumed from {model_dir}") for line in
               result.stderr.splitlines()), result.stderr[-2000:]
    absl_line = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ", re.M)
    assert not absl_line.search(result.stderr + result.stdout), result.stderr[-2000:]
