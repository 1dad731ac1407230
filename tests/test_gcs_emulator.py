"""The `gcs` fixture (tests/gcs_emulator.py) is a real GCS API for TensorFlow's own gs:// client:
files, checkpoints, TFRecords, SavedModels and `.keras` files go in and come back out, and a bucket
keeps a bucket's semantics where TensorFlow's ram:// filesystem does not.

Importing TensorFlow costs seconds, so the session's process inside the emulator's namespace (the
`gcs_worker` fixture) runs every check (`main(gs://.../root)` of this file, also run as a script:
`python test_gcs_emulator.py gs://.../root`) and prints what it observed as one JSON object; each
test asserts on its part of it, and on what landed in the bucket as the test process lists it past
TensorFlow.
"""

import json
import os
import sys
import traceback

import pytest

from gcs_emulator import Unavailable, emulator

ROOT = "tf"  # every check writes under gs://BUCKET/tf/<check>/


# --------------------------------------------------------------------------- in the namespace
def check_gfile(root, tf):
    for name, text in (("a/one.txt", "one"), ("a/b/two.txt", "two")):
        with tf.io.gfile.GFile(f"{root}/{name}", "w") as f:  # uploaded at close
            f.write(text)
    seen = {
        "read": tf.io.gfile.GFile(f"{root}/a/one.txt").read(),
        "listdir_root": sorted(tf.io.gfile.listdir(root)),
        "listdir_a": sorted(tf.io.gfile.listdir(f"{root}/a")),
        "glob": tf.io.gfile.glob(f"{root}/a/*.txt"),
        "isdir": {name: tf.io.gfile.isdir(f"{root}/{name}")
                  for name in ("a", "a/b", "a/one.txt", "a/on", "missing")},
        "exists": {name: tf.io.gfile.exists(f"{root}/{name}")
                   for name in ("a/one.txt", "a/on", "missing")},
    }
    tf.io.gfile.rename(f"{root}/a/one.txt", f"{root}/a/renamed.txt")
    seen["after_rename"] = {"old_exists": tf.io.gfile.exists(f"{root}/a/one.txt"),
                            "new": tf.io.gfile.GFile(f"{root}/a/renamed.txt").read()}
    return seen


def check_checkpoint(root, tf):
    """Two saves with max_to_keep=1, then a restore into new variables by a new manager."""
    values, step = tf.Variable([1.0, 2.0, 3.0]), tf.Variable(1, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(values=values, step=step), root,
                                         max_to_keep=1)
    manager.save(checkpoint_number=1)
    values.assign([4.0, 5.0, 6.0])
    step.assign(2)
    manager.save(checkpoint_number=2)
    restored = {"values": tf.Variable(tf.zeros([3])), "step": tf.Variable(0, dtype=tf.int64)}
    checkpoint = tf.train.Checkpoint(**restored)
    latest = tf.train.CheckpointManager(checkpoint, root, max_to_keep=1).latest_checkpoint
    checkpoint.restore(latest).assert_consumed()
    return {"latest": latest, "values": restored["values"].numpy().tolist(),
            "step": int(restored["step"].numpy())}


def check_tfrecord(root, tf):
    with tf.io.TFRecordWriter(f"{root}/records.tfrecord") as writer:
        for record in RECORDS:
            writer.write(record)
    read = tf.data.TFRecordDataset(f"{root}/records.tfrecord")
    return [record.decode() for record in read.as_numpy_iterator()]


RECORDS = [b"first", b"second", b"x" * 100_000]


def check_saved_model(root, tf):
    """A module whose variable is 4 MB, so that its upload and read-back are not one small body."""
    module = tf.Module()
    module.scale = tf.Variable(tf.range(1_000_000, dtype=tf.float32))
    module.apply = tf.function(lambda x: x * module.scale[:3],
                               input_signature=[tf.TensorSpec([3], tf.float32)])
    tf.saved_model.save(module, f"{root}/saved")
    loaded = tf.saved_model.load(f"{root}/saved")
    return {"apply": loaded.apply(tf.ones([3])).numpy().tolist(),
            "last": float(loaded.scale[-1].numpy())}


def check_keras(root, tf):
    import keras
    import numpy as np
    model = keras.Sequential([keras.Input([4]), keras.layers.Dense(3)])
    x = np.arange(8, dtype="float32").reshape(2, 4)
    model.save(f"{root}/model.keras")
    loaded = keras.models.load_model(f"{root}/model.keras")
    return {"same_predictions": bool(np.array_equal(model.predict(x, verbose=0),
                                                    loaded.predict(x, verbose=0)))}


CHECKS = {"gfile": check_gfile, "checkpoint": check_checkpoint, "tfrecord": check_tfrecord,
          "saved_model": check_saved_model, "keras": check_keras}


def main(root):
    """Every check, each under root/<name>; one failing check leaves the others to report."""
    import tensorflow as tf
    observed = {}
    for name, check in CHECKS.items():
        try:
            observed[name] = {"seen": check(f"{root}/{name}", tf)}
        except Exception:
            observed[name] = {"error": traceback.format_exc()}
    print(json.dumps(observed))


# --------------------------------------------------------------------------- in pytest
@pytest.fixture(scope="module")
def observed(gcs, gcs_worker, tmp_path_factory):
    done = gcs_worker.python(f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
                             f"from test_gcs_emulator import main\nmain({gcs.url(ROOT)!r})\n",
                             cwd=tmp_path_factory.mktemp("observed"), timeout=240)
    assert done.returncode == 0, done.stderr[-5000:]
    return json.loads(done.stdout.splitlines()[-1])


def seen(observed, name):
    assert "error" not in observed[name], observed[name]["error"]
    return observed[name]["seen"]


@pytest.mark.subprocess
def test_gfile_sees_objects_and_prefixes_as_a_bucket_has_them(observed, gcs):
    got = seen(observed, "gfile")
    assert got["read"] == "one"
    assert got["listdir_root"] == ["a/"]
    assert got["listdir_a"] == ["b/", "one.txt"]
    assert got["glob"] == [gcs.url(f"{ROOT}/gfile/a/one.txt")]
    # A directory is a prefix some object name continues with "/": "a/on", a mere prefix of
    # "a/one.txt", is neither a directory nor a file (ram:// says it is both: test below).
    assert got["isdir"] == {"a": True, "a/b": True, "a/one.txt": False, "a/on": False,
                            "missing": False}
    assert got["exists"] == {"a/one.txt": True, "a/on": False, "missing": False}
    assert got["after_rename"] == {"old_exists": False, "new": "one"}
    prefix = f"{ROOT}/gfile/"
    assert gcs.list(prefix) == [prefix + "a/b/two.txt", prefix + "a/renamed.txt"]
    assert gcs.read(prefix + "a/renamed.txt") == b"one"


def test_ram_filesystem_is_no_stand_in_for_a_bucket():
    """Why the tests need the emulator: ram:// takes any prefix of a file's name for an existing
    directory, and does not list the directories its files are in."""
    import tensorflow as tf
    with tf.io.gfile.GFile("ram://tfxl-gcs-contrast/a/one.txt", "w") as f:
        f.write("one")
    assert tf.io.gfile.isdir("ram://tfxl-gcs-contrast/a/on")
    assert tf.io.gfile.exists("ram://tfxl-gcs-contrast/a/on")
    assert tf.io.gfile.listdir("ram://tfxl-gcs-contrast") == []


@pytest.mark.subprocess
def test_checkpoint_manager_saves_keeps_and_restores(observed, gcs):
    prefix = f"{ROOT}/checkpoint/"
    assert seen(observed, "checkpoint") == {"latest": gcs.url(prefix + "ckpt-2"),
                                            "values": [4.0, 5.0, 6.0], "step": 2}
    # max_to_keep=1 deleted ckpt-1, the save's temporary objects are gone; "" is the empty
    # object by which TensorFlow's makedirs marks a directory on GCS.
    assert gcs.list(prefix) == [prefix + name for name in
                                ("", "checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index")]


@pytest.mark.subprocess
def test_tfrecords_written_and_read_by_tf_data(observed, gcs, tmp_path):
    assert seen(observed, "tfrecord") == [r.decode() for r in RECORDS]
    # The object is a valid TFRecord file byte for byte, read here past the gs:// client.
    name = f"{ROOT}/tfrecord/records.tfrecord"
    assert gcs.list(f"{ROOT}/tfrecord/") == [name]
    local = tmp_path / "records.tfrecord"
    local.write_bytes(gcs.read(name))
    import tensorflow as tf
    assert list(tf.data.TFRecordDataset(str(local)).as_numpy_iterator()) == RECORDS


@pytest.mark.subprocess
def test_saved_model_saves_and_loads(observed, gcs):
    assert seen(observed, "saved_model") == {"apply": [0.0, 1.0, 2.0], "last": 999_999.0}
    prefix = f"{ROOT}/saved_model/saved/"
    names = gcs.list(prefix)
    for name in ("saved_model.pb", "variables/variables.index",
                 "variables/variables.data-00000-of-00001"):
        assert prefix + name in names, names
    assert len(gcs.read(prefix + "variables/variables.data-00000-of-00001")) > 4_000_000


@pytest.mark.subprocess
def test_keras_model_saves_and_loads(observed, gcs):
    assert seen(observed, "keras") == {"same_predictions": True}
    assert gcs.list(f"{ROOT}/keras/") == [f"{ROOT}/keras/model.keras"]


def test_without_what_it_needs_the_emulator_says_what_is_missing(monkeypatch, tmp_path):
    """The reason the `gcs` fixture skips with, rather than failing, on such a machine."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no unshare, mount, setpriv or openssl
    with pytest.raises(Unavailable, match="needs root" if os.geteuid() else "`unshare` is not"):
        with emulator():
            pass


if __name__ == "__main__":
    main(sys.argv[1])
