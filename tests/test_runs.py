"""A run's own history stays true: the train log holds each step once after
any restart and is written in parts, never appended; one trainer per model_dir (the lease); a
damaged `checkpoint` state file never blocks resuming; every check that can refuse a run comes
before the first write; the settings that shape a run are recorded and a restart that changes
them is refused unless allowed; extending --train_steps keeps the learning-rate curve."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import factories
from factories import assert_one_error_line, run_in_process
from tfxl.model_dir import ModelDir, check_or_store_config
from tfxl.train.records.lease import Lease, LeaseHeld, LeaseLost, LeaseParams
from tfxl.train.loop.run import TrainingDiverged
from tfxl.train.loop.optimization import OptimizerParams
from tfxl.train.backends import for_strategy
from tfxl.train.records.run_record import RunRecord, run_settings
from tfxl.train.records import train_log
from tfxl.train.records.train_log import TrainLog, read_train_log, resume_train_log

T = 8          # segment length of the test data
STREAMS = 4    # streams per split
FAST = LeaseParams(settle=0.05)  # in-process runs: nothing else starts on their model_dirs


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return factories.random_bytes_data(tmp_path_factory.mktemp("runs"), T, STREAMS)


def runner(data_dir, model_dir, steps, lease=FAST, allow_run_changes=False, **opt):
    config = factories.data_config(data_dir, tgt_len=T)
    check_or_store_config(str(model_dir), config, store=False)  # what tfxl-train does
    opt = OptimizerParams(**{**dict(learning_rate=3e-3, train_steps=steps, min_lr_ratio=1.0),
                             **opt})
    return factories.language_model_run(
        config, data_dir=data_dir, model_dir=str(model_dir), global_batch=STREAMS, optimizer=opt,
        steps_per_loop=5, lease=lease, allow_run_changes=allow_run_changes)


def train(data_dir, model_dir, steps, save_every=10, **opt):
    """Trains `model_dir` to `steps`; returns the messages of the run."""
    messages = []
    runner(data_dir, model_dir, steps, **opt).train(save_every=save_every, log=messages.append)
    return messages


def logged(model_dir, key="loss"):
    return {r["step"]: r[key] for r in read_train_log(str(model_dir))}


def lines_on_storage(model_dir):
    """Every line of every train log file, whatever its layout (duplicates count)."""
    files = [p for p in model_dir.rglob("*") if p.is_file() and "train_log" in str(
        p.relative_to(model_dir))]
    return sum(len(p.read_text().splitlines()) for p in files)


def files_of(model_dir):
    return {p: p.read_bytes() for p in model_dir.rglob("*") if p.is_file()}


def cli_flags(data_dir, model_dir, steps, *extra):
    return [f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--n_layer=1", "--d_model=16",
            "--n_head=2", "--d_head=8", "--d_inner=32", "--dropout=0.1", f"--tgt_len={T}",
            f"--mem_len={T}", f"--train_batch_size={STREAMS}", f"--train_steps={steps}",
            "--steps_per_loop=5", "--save_every=10", "--learning_rate=0.003",
            "--lease_settle=0.1", *extra]


@pytest.fixture(scope="module")
def straight(data_dir, tmp_path_factory):
    """The losses of an uninterrupted 30-step run (the reference of every resumed one)."""
    model_dir = tmp_path_factory.mktemp("straight") / "m"
    train(data_dir, model_dir, 30)
    return logged(model_dir)


# A model_dir trained to step 20 (checkpoints 10 and 20), once; each test resumes a copy.
trained_to_20, trained_copy = factories.trained_model_dir_fixtures(train)


def assert_continues_exactly(model_dir, straight, steps=30):
    got = logged(model_dir)
    assert sorted(got) == list(range(1, steps + 1))
    assert lines_on_storage(model_dir) == steps  # each step once, in no more than one file
    for step in range(1, steps + 1):  # dropout on: weights, optimizer and RNG come back
        assert got[step] == pytest.approx(straight[step], abs=1e-5), step


# -- the train log -------------------------------------------------------------------------------

def write_part(model_dir, steps, loss=1.0):
    layout = ModelDir(str(model_dir))
    os.makedirs(layout.train_log_parts, exist_ok=True)
    with open(layout.train_log_part(steps[0], steps[-1]), "w") as f:
        f.writelines(json.dumps({"step": s, "loss": loss}) + "\n" for s in steps)


def test_the_reader_returns_each_step_once_and_skips_a_partial_line(tmp_path):
    write_part(tmp_path, [1, 2, 3], loss=9.0)
    with open(tmp_path / "train_log" / "0000000001-0000000003.jsonl", "a") as f:
        f.write('{"step": 4, "lo')
    write_part(tmp_path, [3, 4, 5])
    write_part(tmp_path, [3, 4])  # left by an interrupted merge: the same lines
    (tmp_path / "train_log" / "0000000003-0000000005.jsonl.tmp-12").write_text("not a part")
    records = read_train_log(str(tmp_path))
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["loss"] for r in records] == [9.0, 9.0, 1.0, 1.0, 1.0]  # the later part wins
    assert read_train_log(str(tmp_path / "nothing")) == []


def test_resuming_the_log_keeps_each_step_up_to_the_checkpoint_once(tmp_path):
    write_part(tmp_path, [1, 2, 3, 4, 5])
    write_part(tmp_path, [6, 7, 8])
    write_part(tmp_path, [6, 7])          # inside 6..8: an interrupted merge
    write_part(tmp_path, [9, 10, 11, 12])  # straddles the checkpoint's step
    write_part(tmp_path, [13, 14])         # after it
    messages = []
    resume_train_log(str(tmp_path), 10, messages.append)
    names = sorted(os.listdir(tmp_path / "train_log"))
    assert names == ["0000000001-0000000005.jsonl", "0000000006-0000000008.jsonl",
                     "0000000009-0000000010.jsonl"]
    assert [r["step"] for r in read_train_log(str(tmp_path))] == list(range(1, 11))
    assert any("dropped steps 11..14" in m for m in messages), messages
    resume_train_log(str(tmp_path), 0, messages.append)  # no checkpoint: the log starts again
    assert read_train_log(str(tmp_path)) == [] and "starts again at step 1" in messages[-1]


def test_the_log_is_written_in_parts_each_once_by_time_and_before_every_save(tmp_path,
                                                                              monkeypatch):
    now = [0.0]
    log = TrainLog(str(tmp_path), flush_seconds=10, clock=lambda: now[0])

    def loop(first, n):
        log({"first_step": first, "loss": np.ones(n), "grad_norm": np.ones(n),
             "learning_rate": np.ones(n)})

    def parts():
        return sorted(os.listdir(tmp_path / "train_log"))

    loop(0, 5)
    assert not (tmp_path / "train_log").exists()  # kept in memory: no write per loop
    now[0] = 11.0
    loop(5, 5)
    assert parts() == ["0000000001-0000000010.jsonl"]
    loop(10, 5)
    log.flush(15)  # before the checkpoint of step 15: its steps are stored first
    assert parts() == ["0000000001-0000000010.jsonl", "0000000011-0000000015.jsonl"]
    log.merge(15)  # after it: one part per checkpoint
    assert parts() == ["0000000001-0000000015.jsonl"]
    loop(15, 3)
    log.close()
    assert parts() == ["0000000001-0000000015.jsonl", "0000000016-0000000018.jsonl"]
    assert [r["step"] for r in read_train_log(str(tmp_path))] == list(range(1, 19))
    monkeypatch.setattr(train_log, "MERGE_LINES", 4)  # a long interval is not kept in memory
    now[0] = 30.0
    loop(18, 3)
    now[0] = 50.0
    loop(21, 3)
    log.merge(24)
    assert parts()[-2:] == ["0000000019-0000000021.jsonl", "0000000022-0000000024.jsonl"]


def test_a_resumed_run_writes_only_its_new_lines_and_never_appends(data_dir, trained_copy,
                                                                    monkeypatch):
    model_dir = trained_copy
    opened = []
    gfile = tf.io.gfile.GFile

    def spy(path, mode="r"):
        opened.append((str(path), mode))
        return gfile(path, mode)

    monkeypatch.setattr(tf.io.gfile, "GFile", spy)
    train(data_dir, model_dir, 30)
    assert not [o for o in opened if "a" in o[1]], opened  # an object store cannot append
    written = [os.path.basename(p) for p, mode in opened if "w" in mode and "train_log" in p]
    # steps 21..30 only: one part before the save of step 30 (nothing of steps 1..20 rewritten)
    assert written and all(name.startswith("0000000021-0000000030.jsonl") for name in written)
    assert sorted(logged(model_dir)) == list(range(1, 31)) and lines_on_storage(model_dir) == 30


def test_all_checkpoints_moved_away_the_log_starts_again(data_dir, tmp_path, straight,
                                                          trained_copy):
    model_dir = trained_copy
    shutil.move(model_dir / "checkpoints", tmp_path / "moved")
    messages = train(data_dir, model_dir, 30)
    assert any("dropped steps 1..20" in m and "starts again at step 1" in m for m in messages)
    assert_continues_exactly(model_dir, straight)


@pytest.fixture(scope="module")
def straight_cli_dir(data_dir, tmp_path_factory):
    """The model_dir of tfxl-train's uninterrupted run of cli_flags to step 30."""
    model_dir = tmp_path_factory.mktemp("straight_cli") / "m"
    result = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, 30))
    assert result.returncode == 0, result.stderr[-2000:]
    return model_dir


@pytest.fixture(scope="module")
def straight_cli(straight_cli_dir):
    return logged(straight_cli_dir)


@pytest.mark.large
@pytest.mark.subprocess
@pytest.mark.parametrize("checkpoint", ["ckpt-10", "ckpt-20"])
def test_kill_9_between_the_log_and_its_checkpoint_logs_each_step_once(data_dir, tmp_path,
                                                                      straight_cli, checkpoint):
    """Killed in the save of `checkpoint`, after its steps were logged: ckpt-10, the run's
    first (no checkpoint yet: the next run starts at step 1), or ckpt-20 (it resumes at 10)."""
    model_dir, marker = tmp_path / "m", tmp_path / "in_save"
    proc = subprocess.Popen([sys.executable, "-c", factories.HANG_IN_SAVE,
                             "tensorflow.python.ops.gen_io_ops",
                             "merge_v2_checkpoints", checkpoint, str(marker),
                             *cli_flags(data_dir, model_dir, 30)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    factories.kill_9_in_the_save(proc, marker, timeout=240)
    saved = int(checkpoint.split("-")[1])
    assert sorted(logged(model_dir)) == list(range(1, saved + 1))  # logged before the save
    resumed = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, 30))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"dropped steps {saved - 9}..{saved}" in resumed.stderr
    assert_continues_exactly(model_dir, straight_cli)


# -- one trainer per model_dir -------------------------------------------------------------------

def write_lease(model_dir, **fields):
    os.makedirs(model_dir, exist_ok=True)
    lease = {"owner": "someone", "host": "elsewhere", "pid": 1, "started": time.time(),
             "heartbeat": time.time(), "timeout": 300.0, **fields}
    (model_dir / "lease.json").write_text(json.dumps(lease))


@pytest.mark.subprocess  # a process that is gone, for its pid
def test_a_live_lease_refuses_and_a_stale_one_is_taken_over(tmp_path):
    model_dir = tmp_path / "m"
    first = Lease(str(model_dir), FAST).acquire()
    with pytest.raises(LeaseHeld) as refused:
        Lease(str(model_dir), FAST).acquire()
    message = str(refused.value)
    assert f"pid {os.getpid()}" in message and "--take_over" in message, message
    assert "lease expires (300 s without a heartbeat)" in message
    first.release()
    assert not (model_dir / "lease.json").exists()

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket
    for fields, reason in [
            (dict(heartbeat=time.time() - 400), "no heartbeat for 400 s"),
            (dict(host=socket.gethostname(), pid=dead.pid), f"process {dead.pid} on this host "
                                                             "is gone"),
            ({}, None)]:
        if reason is None:
            (model_dir / "lease.json").write_bytes(b"\xff{garbage")
            reason = "is unreadable"
        else:
            write_lease(model_dir, **fields)
        messages = []
        lease = Lease(str(model_dir), FAST, log=messages.append).acquire()
        assert len(messages) == 1 and "taking over" in messages[0] and reason in messages[0], (
            messages)
        assert json.loads((model_dir / "lease.json").read_text())["owner"] == lease.owner
        lease.release()


def test_take_over_stops_the_trainer_that_held_the_lease(tmp_path):
    model_dir = tmp_path / "m"
    holder = Lease(str(model_dir), LeaseParams(settle=0.05, renew=0.05)).acquire()
    messages = []
    taker = Lease(str(model_dir), LeaseParams(settle=0.3, take_over=True),
                  log=messages.append).acquire()
    assert "--take_over" in messages[0] and f"pid {os.getpid()}" in messages[0], messages
    deadline = time.time() + 10
    while not holder.lost and time.time() < deadline:
        time.sleep(0.05)
    with pytest.raises(LeaseLost, match="another trainer took the lease"):
        holder.ensure_held()
    holder.release()  # does not delete the taker's lease
    assert json.loads((model_dir / "lease.json").read_text())["owner"] == taker.owner
    taker.release()
    assert not (model_dir / "lease.json").exists()


def test_two_trainers_starting_together_one_goes_on(tmp_path):
    """Both find no lease, then both write theirs (the race gfile cannot prevent): the later
    write wins, and the earlier writer reads the other's lease back and is refused."""
    model_dir = tmp_path / "m"
    both_checked = threading.Barrier(2)

    class Together(Lease):
        def _write(self):
            if not getattr(self, "wrote", False):  # the first write: after both have looked
                both_checked.wait()
                self.wrote = True
            super()._write()

    leases = [Together(str(model_dir), LeaseParams(settle=0.5)) for _ in range(2)]
    outcome = {}

    def start(lease):
        try:
            lease.acquire()
            outcome[lease.owner] = "holds"
        except LeaseHeld as err:
            outcome[lease.owner] = str(err)

    threads = [threading.Thread(target=start, args=(lease,)) for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(v == "holds" for v in outcome.values()) == [False, True], outcome
    refused = next(v for v in outcome.values() if v != "holds")
    assert "took its lease at the same time" in refused, refused
    for lease in leases:
        lease.release()
    assert not (model_dir / "lease.json").exists()


def test_the_lease_is_held_while_training_and_released_when_it_fails(data_dir, tmp_path,
                                                                      monkeypatch):
    model_dir = tmp_path / "m"
    run = runner(data_dir, model_dir, 50, learning_rate=1e30, clip=1e30)
    held = []
    original = run.train_step.train

    def train_and_look(n):
        held.append(json.loads((model_dir / "lease.json").read_text())["pid"])
        return original(n)

    monkeypatch.setattr(run.train_step, "train", train_and_look)
    with pytest.raises(TrainingDiverged):
        run.train(save_every=10, log=lambda message: None)
    assert held and set(held) == {os.getpid()}
    assert not (model_dir / "lease.json").exists()


@pytest.mark.large
@pytest.mark.subprocess
def test_a_second_tfxl_train_is_refused_and_a_dead_ones_lease_taken_over(data_dir, tmp_path):
    model_dir = tmp_path / "m"
    first = subprocess.Popen([sys.executable, "-m", "tfxl.train.main",
                              *cli_flags(data_dir, model_dir, 10 ** 6, "--save_every=0")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while not (model_dir / "lease.json").exists() and time.time() < deadline:
            time.sleep(0.1)
        assert first.poll() is None, "the first trainer stopped"
        # The second and third tfxl-train decide from the lease file alone: in this process.
        second = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, 10))
        assert_one_error_line(second, "in use by another trainer", f"pid {first.pid}",
                              "--take_over")
        assert first.poll() is None  # the first trains on
    finally:
        first.kill()  # kill -9: its lease stays behind, its process is gone
        first.wait()
    third = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, 10))
    assert third.returncode == 0, third.stderr[-2000:]
    assert f"taking over the lease of {model_dir}" in third.stderr
    assert f"its process {first.pid} on this host is gone" in third.stderr
    assert not (model_dir / "lease.json").exists()  # released at the end
    assert sorted(logged(model_dir)) == list(range(1, 11))


# -- a damaged `checkpoint` state file -----------------------------------------------------------

@pytest.mark.parametrize("damage", [b"", b"model_checkpoint_path: {{{ garbage",
                                    b"\xff\xfe\x00\x81"], ids=["empty", "garbage", "not_utf8"])
def test_a_damaged_checkpoint_state_file_never_blocks_resuming(data_dir, straight, trained_copy,
                                                               damage):
    model_dir = trained_copy
    state = model_dir / "checkpoints" / "checkpoint"
    state.write_bytes(damage)
    messages = train(data_dir, model_dir, 30)
    said = [m for m in messages if "checkpoint state file" in m]
    assert len(said) == 1 and str(state) in said[0] and "damaged" in said[0], messages
    assert "rewritten from the checkpoint files (ckpt-10, ckpt-20)" in said[0]
    assert any("resumed from" in m and m.endswith("ckpt-20 at step 20") for m in messages)
    assert_continues_exactly(model_dir, straight)
    saved = tf.train.get_checkpoint_state(str(model_dir / "checkpoints"))
    assert [os.path.basename(p) for p in saved.all_model_checkpoint_paths] == [
        "ckpt-10", "ckpt-20", "ckpt-30"]  # the manager knows them all again (max_to_keep)


# -- every check that can refuse a run comes before the first write ------------------------------

def flip_a_byte(path):
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_a_corrupt_train_shard_is_refused_before_anything_is_written(data_dir, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    trained = tmp_path / "trained"
    train(str(data), trained, 10)
    before = files_of(trained)
    flip_a_byte(sorted(data.glob("train-stream-*"))[2])  # same size: only reading finds it
    for model_dir, steps in ((tmp_path / "new", 10), (trained, 20)):
        with pytest.raises(ValueError, match=r"corrupt TFRecord shard \S+: corrupted record "
                                             r"at \d+ "):  # TensorFlow's own reason, as eagerly
            train(str(data), model_dir, steps)
    assert not (tmp_path / "new").exists()  # no config.json, data.json, run.json, lease
    assert files_of(trained) == before


def test_the_shards_record_count_is_traced_once_per_process(data_dir):
    """verify_shards' CRC read is one tf.function for every shard of every split: an eager
    `reduce` traced its function anew for each shard, most of the check's time in every run."""
    from tfxl.data import pipeline
    splits = json.loads(open(os.path.join(data_dir, "manifest.json")).read())["splits"]
    pipeline.verify_shards(data_dir, splits["train"]["streams"])
    traced = pipeline._count_records.experimental_get_tracing_count()
    for split in ("train", "valid", "test"):
        pipeline.verify_shards(data_dir, splits[split]["streams"])
    assert traced == pipeline._count_records.experimental_get_tracing_count() >= 1


def test_a_manifest_with_a_bad_field_type_is_refused_before_anything_is_written(data_dir,
                                                                                tmp_path):
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["pad_id"] = str(manifest["pad_id"])
    (data / "manifest.json").write_text(json.dumps(manifest))
    assert_one_error_line(run_in_process("tfxl.train.main",
                                         *cli_flags(str(data), tmp_path / "m", 10)),
                          "'pad_id' must be an integer", "re-run tfxl-prepare")
    assert not (tmp_path / "m").exists()


# -- recorded runs -------------------------------------------------------------------------------

@pytest.mark.large
def test_extending_train_steps_keeps_the_learning_rate_curve(data_dir, tmp_path):
    model_dir = tmp_path / "m"
    lr, ratio = 3e-3, 0.1
    train(data_dir, model_dir, 30, learning_rate=lr, min_lr_ratio=ratio, warmup_steps=5)
    messages = train(data_dir, model_dir, 40, learning_rate=lr, min_lr_ratio=ratio,
                     warmup_steps=5)
    assert any("goes past the learning-rate schedule's 30 steps" in m for m in messages)
    rates = logged(model_dir, "learning_rate")
    assert sorted(rates) == list(range(1, 41))
    # The step-s update uses schedule(s - 1): step 31 is the first at the schedule's end, and the
    # rate stays there; before it the curve is the one steps 1..30 followed.
    for step in range(31, 41):
        assert rates[step] == pytest.approx(lr * ratio, rel=1e-6), step
    assert rates[30] > rates[31] and rates[30] - rates[31] < rates[29] - rates[30]
    record = json.loads((model_dir / "run.json").read_text())
    assert record["settings"]["schedule_steps"] == 30
    assert [(h["at_step"], h["train_steps"]) for h in record["history"]] == [(0, 30), (30, 40)]


def test_a_restart_with_other_settings_is_refused_unless_allowed(data_dir, trained_copy):
    model_dir = trained_copy  # trained to step 20 by `train`'s settings
    before = files_of(model_dir)
    with pytest.raises(ValueError) as refused:
        train(data_dir, model_dir, 30, learning_rate=1e-3, clip=0.5)
    message = str(refused.value)
    assert "learning_rate: run.json has 0.003, this run 0.001" in message, message
    assert "clip: run.json has 0.25, this run 0.5" in message
    assert "--allow_run_changes" in message and "warmup_steps" not in message
    assert files_of(model_dir) == before  # refused before anything was written
    messages = train(data_dir, model_dir, 30, learning_rate=1e-3, clip=0.5,
                     allow_run_changes=True)
    assert any("run settings changed" in m and "--allow_run_changes" in m for m in messages)
    record = json.loads((model_dir / "run.json").read_text())
    assert record["settings"]["learning_rate"] == 1e-3 and record["settings"]["clip"] == 0.5
    assert record["history"][-1]["at_step"] == 20
    assert record["history"][-1]["changed"] == {"learning_rate": [0.003, 0.001],
                                                "clip": [0.25, 0.5]}
    assert logged(model_dir, "learning_rate")[21] == pytest.approx(1e-3)


def test_the_recorded_settings_and_a_run_without_a_checkpoint(tmp_path, mirrored):
    settings = run_settings(OptimizerParams(train_steps=100), 8, "mixed_bfloat16", 3, 50,
                            for_strategy(mirrored))
    assert settings == {
        "optimizer": "adam", "weight_decay": 0.0, "learning_rate": 2.5e-4, "warmup_steps": 0,
        "min_lr_ratio": 0.004, "schedule_steps": None, "train_batch_size": 8, "clip": 0.25,
        "mixed_precision": "mixed_bfloat16", "seed": 3, "steps_per_loop": 50,
        "strategy": "mirrored", "replicas": 2}
    first = RunRecord.resolve(str(tmp_path), settings, 100, resuming=False)
    assert first.schedule_steps == 100
    first.store(0)
    other = run_settings(OptimizerParams(train_steps=100), 8, "float32", 3, 50,
                         for_strategy(tf.distribute.get_strategy()))
    with pytest.raises(ValueError, match=r"mixed_precision: run.json has 'mixed_bfloat16', "
                                         r"this run 'float32'; strategy: run.json has "
                                         r"'mirrored', this run 'default'; replicas: run.json "
                                         r"has 2, this run 1\)"):
        RunRecord.resolve(str(tmp_path), other, 100, resuming=True)
    # No checkpoint to continue: nothing was trained with the recorded settings.
    fresh = RunRecord.resolve(str(tmp_path), other, 200, resuming=False)
    assert fresh.schedule_steps == 200 and "replace the recorded ones" in fresh.messages[0]


def test_tfxl_train_refuses_a_changed_setting_in_one_line(data_dir, tmp_path, straight_cli_dir):
    # A copy of tfxl-train's run of cli_flags to step 30.
    model_dir = Path(shutil.copytree(straight_cli_dir, tmp_path / "m"))
    before = files_of(model_dir)
    assert_one_error_line(run_in_process("tfxl.train.main",
                                         *cli_flags(data_dir, model_dir, 40, "--clip=0.5")),
                          "clip: run.json has 0.25, this run 0.5", "--allow_run_changes")
    assert files_of(model_dir) == before
    allowed = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, 40, "--clip=0.5",
                                                          "--allow_run_changes"))
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert sorted(logged(model_dir)) == list(range(1, 41))


# -- on a bucket ---------------------------------------------------------------------------------

READ_LOG = """
import json
from tfxl.train.records.train_log import read_train_log
print(json.dumps(read_train_log({model_dir!r})))
"""


@pytest.mark.large
@pytest.mark.subprocess
def test_on_a_bucket_the_log_lease_and_record_work_without_append_or_rename(gcs, gcs_worker,
                                                                            data_dir, tmp_path,
                                                                            straight_cli):
    """tfxl-train with a gs:// model_dir against the GCS emulator: parts written once (their
    generations never change), the lease refuses and is taken over, run.json recorded, a damaged
    state file rewritten, and each step logged once, with the losses of a local run. The three
    runs and the read-back: the session's process in the emulator's namespace (`gcs_worker`)."""
    prefix = f"runs-{tmp_path.name}/m/"
    model_dir = gcs.url(prefix.rstrip("/"))

    def flags(steps):  # the schedule of the local 30-step run: the same losses
        return cli_flags(data_dir, model_dir, steps, "--schedule_steps=30")

    def objects():
        return {name: gcs.read(name) for name in gcs.list(prefix) if not name.endswith("/")}

    def generation(name):
        return json.loads(gcs._get(f"/storage/v1/b/{gcs.bucket}/o/"
                                   + urllib.parse.quote(name, safe="")))["generation"]

    worker = gcs_worker
    first = worker.tool("tfxl.train.main", *flags(20), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    parts = [f"{prefix}train_log/0000000001-0000000010.jsonl",
             f"{prefix}train_log/0000000011-0000000020.jsonl"]
    written = objects()
    assert all(name in written
               for name in parts + [f"{prefix}run.json", f"{prefix}config.json"])
    assert f"{prefix}lease.json" not in written  # released
    assert not [name for name in written if ".tmp-" in name]  # one object write, no rename
    generations = {name: generation(name) for name in parts}

    alive = {"owner": "x", "host": "elsewhere", "pid": 7, "started": time.time(),
             "timeout": 300.0}
    gcs.write(f"{prefix}lease.json", json.dumps({**alive, "heartbeat": time.time()}))
    before = objects()
    refused = worker.tool("tfxl.train.main", *flags(30), cwd=tmp_path)
    assert_one_error_line(refused, "in use by another trainer", "host elsewhere, pid 7")
    assert objects() == before

    gcs.write(f"{prefix}lease.json", json.dumps({**alive, "heartbeat": time.time() - 1000}))
    gcs.write(f"{prefix}checkpoints/checkpoint", b"")
    resumed = worker.tool("tfxl.train.main", *flags(30), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "taking over the lease" in resumed.stderr
    assert "no heartbeat for 10" in resumed.stderr
    assert "rewritten from the checkpoint files (ckpt-10, ckpt-20)" in resumed.stderr
    assert {name: generation(name) for name in parts} == generations  # never rewritten
    names = gcs.list(prefix)
    assert f"{prefix}train_log/0000000021-0000000030.jsonl" in names
    assert f"{prefix}lease.json" not in names
    record = json.loads(gcs.read(f"{prefix}run.json"))
    assert [h["train_steps"] for h in record["history"]] == [20, 30]
    log = worker.python(READ_LOG.format(model_dir=model_dir), cwd=tmp_path)
    assert log.returncode == 0, log.stderr[-2000:]
    losses = {r["step"]: r["loss"] for r in json.loads(log.stdout.splitlines()[-1])}
    assert sorted(losses) == list(range(1, 31))
    for step in range(1, 31):
        assert losses[step] == pytest.approx(straight_cli[step], abs=1e-5), step


# -- damaged records: one error naming the file and the field ------------------------------------

@pytest.mark.parametrize("record,needle", [
    ({"settings": None, "history": []}, "'settings'"),
    ({"history": []}, "'settings'"),
    ({"settings": {}, "history": 3}, "'history'"),
    ({"settings": {}, "history": ["x"]}, "'history'"),
    ({"settings": {"schedule_steps": "many"}, "history": []}, "'schedule_steps'"),
])
def test_a_damaged_run_record_is_one_error_naming_its_field(data_dir, tmp_path, record, needle):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "run.json").write_text(json.dumps(record))
    kept = files_of(model_dir)
    result = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, 10))
    assert_one_error_line(result, str(model_dir / "run.json"), needle)
    assert files_of(model_dir) == kept


@pytest.mark.parametrize("fields,needle", [
    (dict(timeout=None), "'timeout'"), (dict(timeout="300"), "'timeout'"),
    (dict(timeout=-1), "'timeout'"), (dict(started=1e300), "'started'"),
    (dict(heartbeat=1e300), "'heartbeat'"), (dict(heartbeat=float("nan")), "'heartbeat'"),
    (dict(pid="1"), "'pid'"), (dict(host=5), "'host'"), (dict(owner=None), "'owner'"),
])
def test_a_damaged_lease_is_taken_over_naming_its_field(tmp_path, fields, needle):
    # A lease is tfxl's own lock, renewed every few seconds: a damaged one is unreadable, as one
    # of garbage bytes is, and taken over with a message naming the file and the field.
    model_dir = tmp_path / "m"
    write_lease(model_dir, **fields)
    messages = []
    lease = Lease(str(model_dir), FAST, log=messages.append).acquire()
    try:
        assert len(messages) == 1 and "taking over" in messages[0], messages
        assert str(model_dir / "lease.json") in messages[0] and needle in messages[0], messages
    finally:
        lease.release()


@pytest.mark.parametrize("fields,needle", [
    (dict(timeout=None), "'timeout'"), (dict(started=1e300), "'started'")])
def test_a_damaged_lease_never_stops_a_tool_with_a_traceback(data_dir, tmp_path, fields, needle):
    model_dir = tmp_path / "m"
    write_lease(model_dir, **fields)
    result = run_in_process("tfxl.train.main", *cli_flags(data_dir, model_dir, 5))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "taking over" in result.stderr and needle in result.stderr, result.stderr[-2000:]


def test_damaged_data_and_metrics_records_name_their_field(data_dir, tmp_path):
    from tfxl.data.manifest import load_manifest
    from tfxl.model_dir import check_data_fingerprint

    model_dir = tmp_path / "m"
    model_dir.mkdir()
    manifest = load_manifest(str(data_dir))
    for record, needle in [({"vocab_sha256": 5}, "'vocab_sha256'"),
                           ({"vocab_sha256": None, "vocab_size": "258"}, "'vocab_size'")]:
        (model_dir / "data.json").write_text(json.dumps(record))
        with pytest.raises(ValueError, match=rf"data.json.*{needle}"):
            check_data_fingerprint(str(model_dir), manifest, str(data_dir))


def test_a_finished_run_with_a_damaged_metrics_record_is_one_error(data_dir, tmp_path,
                                                                   trained_copy):
    model_dir = trained_copy  # trained to step 20
    (model_dir / "metrics.json").write_text(json.dumps({"step": "twenty"}))
    kept = files_of(model_dir)
    with pytest.raises(ValueError, match=r"metrics.json.*'step'"):
        train(data_dir, model_dir, 20)
    assert files_of(model_dir) == kept


def test_train_log_records_of_another_shape_are_skipped(tmp_path):
    write_part(tmp_path, range(1, 4))
    part = tmp_path / "train_log" / "0000000004-0000000006.jsonl"
    part.write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 4, "loss": "high"}, {"step": True, "loss": 1.0}, {"step": 6, "loss": 1.0}]))
    assert [r["step"] for r in read_train_log(str(tmp_path))] == [1, 2, 3, 6]
