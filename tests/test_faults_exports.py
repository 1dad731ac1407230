"""Exports on disk: a damaged one is one `error:` line naming the damaged file (load_export,
tfxl-generate), and `model.export(path)` says where the export is, not where it was built."""

import os
import shutil
import types

import pytest
import tensorflow as tf

from factories import assert_one_error_line, run_in_process, tiny_lm
from tfxl.saved_model import publish
from tfxl.saved_model.reading import load_export

DATA = os.path.join("variables", "variables.data-00000-of-00001")
INDEX = os.path.join("variables", "variables.index")


@pytest.fixture(scope="module")
def sound_export(tmp_path_factory):
    """A small SavedModel with variables (what every export is made of, without a model)."""
    module = tf.Module()
    module.weights = tf.Variable(tf.range(4096, dtype=tf.float32))
    module.total = tf.function(lambda: tf.reduce_sum(module.weights), input_signature=[])
    path = str(tmp_path_factory.mktemp("export") / "1")
    tf.saved_model.save(module, path)
    return path


def damaged(sound, tmp_path, damage):
    path = str(tmp_path / "1")
    shutil.copytree(sound, path)
    damage(path)
    return path


def truncate(name, size):
    def cut(path):
        with open(os.path.join(path, name), "r+b") as f:
            f.truncate(size)
    return cut


def overwrite(name, content):
    def write(path):
        with open(os.path.join(path, name), "wb") as f:
            f.write(content)
    return write


def test_a_sound_export_loads(sound_export):
    assert float(load_export(sound_export).total()) == sum(range(4096))


@pytest.mark.parametrize("damage, file, why", [
    (truncate(DATA, 5000), DATA, "is shorter than its index says: truncated"),
    (overwrite(INDEX, b"garbage"), INDEX, "is not a variables index (file is too short"),
    (overwrite(INDEX, bytes(range(256)) * 4), INDEX, "is not a variables index"),
    (lambda path: os.remove(os.path.join(path, DATA)), DATA, "is missing"),
    (truncate("saved_model.pb", 100), "saved_model.pb", "does not parse as a SavedModel"),
], ids=["data truncated", "index too short", "index garbage", "data missing", "graph cut"])
def test_a_damaged_export_is_one_error_naming_the_file(sound_export, tmp_path, damage, file,
                                                       why):
    path = damaged(sound_export, tmp_path, damage)
    with pytest.raises(ValueError) as refused:
        load_export(path)
    message = str(refused.value)
    assert message.startswith(f"{path} is a damaged export: {os.path.join(path, file)} {why}"), \
        message
    assert message.endswith("; copy or export it again") and "\n" not in message


def test_model_export_says_the_path_it_published_not_the_staging_one(tmp_path, capsys):
    module = tf.Module()
    module.weights = tf.Variable([1.0, 2.0])
    function = tf.function(lambda x: {"y": x * module.weights},
                           input_signature=[tf.TensorSpec([2], tf.float32, name="x")])
    signatures = types.SimpleNamespace(
        model=types.SimpleNamespace(variables=[types.SimpleNamespace(value=module.weights)],
                                    config=types.SimpleNamespace(vocab_size=2)),
        tokenizer=None, functions={"scale": function}, serving_default="scale",
        export_record=dict)
    target = tmp_path / "exports" / "mini"
    publish.publish_at(signatures, str(target))
    shown = capsys.readouterr().out
    assert shown.splitlines()[0] == f"Saved the SavedModel at {target}; its signatures:", shown
    assert "scale(x: float32 [2]) -> y: float32 [2]" in shown and ".tmp-" not in shown
    assert os.listdir(target.parent) == ["mini"]
    publish.publish_at(signatures, str(tmp_path / "quiet"), verbose=False)
    assert capsys.readouterr().out == ""


@pytest.mark.large
def test_generate_from_a_damaged_export_is_one_error_line_naming_the_file(tmp_path):
    from tfxl.models.signatures import export_saved_model
    from tfxl.data.tokenizers import BytesTokenizer
    exported = export_saved_model(tiny_lm(vocab_size=258), str(tmp_path / "exports"), score_top_k=0,
                                  tokenizer=BytesTokenizer())
    for name, damage, why in ((DATA, truncate(DATA, 100), "truncated"),
                              (INDEX, overwrite(INDEX, b"x" * 10), "not a variables index")):
        path = str(tmp_path / name.replace(os.sep, "-"))
        shutil.copytree(exported, path)
        damage(path)
        assert_one_error_line(run_in_process("tfxl.serving.generate_main", f"--model={path}",
                                             "--prompt=ab", "--max_new_tokens=2"),
                              f"{path} is a damaged export", os.path.join(path, name), why)
    done = run_in_process("tfxl.serving.generate_main", f"--model={exported}", "--prompt=ab",
                          "--max_new_tokens=2")
    assert done.returncode == 0, done.stderr[-3000:]
