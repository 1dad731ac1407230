"""The one `error:` line of a TensorFlow error: the op's own message, not its stack."""

import os

import pytest

from tfxl.cli.errors import fail, op_message


def test_a_shard_deleted_under_a_compiled_step_is_its_message_only(tmp_path, capsys):
    import tensorflow as tf
    shard = str(tmp_path / "train-00000-of-00001.tfrecord")
    with tf.io.TFRecordWriter(shard) as writer:
        for _ in range(3):
            writer.write(b"record")
    iterator = iter(tf.data.TFRecordDataset([shard, shard]))
    step = tf.function(lambda it: it.get_next())
    step(iterator)
    os.remove(shard)
    with pytest.raises(tf.errors.NotFoundError) as raised:
        for _ in range(10):
            step(iterator)
    assert fail(raised.value) == 2
    assert capsys.readouterr().err == f"error: {shard}; No such file or directory\n"


def test_a_corrupt_record_ends_with_its_message_not_the_ops_name(tmp_path, capsys):
    import tensorflow as tf
    (tmp_path / "bad.tfrecord").write_bytes(b"garbage" * 20)
    with pytest.raises(tf.errors.DataLossError) as raised:
        tf.data.TFRecordDataset([str(tmp_path / "bad.tfrecord")]).reduce(0, lambda a, b: a + 1)
    assert "[Op:ReduceDataset]" in str(raised.value)
    fail(raised.value)
    assert capsys.readouterr().err == (
        "error: corrupted record at 0 (Is this even a TFRecord file?)\n")


def test_the_python_stack_of_the_failing_node_is_left_out():
    # As TensorFlow 2.21 words an error raised in a tf.function defined in a file.
    said = ('Graph execution error:\n\nDetected at node IteratorGetNext defined at (most recent '
            'call last):\n  File "/tmp/run.py", line 10, in <module>\n\n  File "/tmp/run.py", '
            'line 8, in step\n\n/data/train-00003.tfrecord; No such file or directory\n\t '
            '[[{{node IteratorGetNext}}]] [Op:__inference_step_20]')
    assert op_message(said) == "/data/train-00003.tfrecord; No such file or directory"


def test_other_messages_are_kept_whole():
    message = "data/train-00001.tfrecord: 3 records, the manifest says 4 [see docs/data.md]"
    assert op_message(message) == message
