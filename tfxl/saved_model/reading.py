"""Reading an export: `load_export`, `tf.saved_model.load` with every way a damaged export fails
told as one ValueError naming the file that is damaged.

TensorFlow's own errors name no file for a damaged variables index ("file is too short to be an
sstable", "not an sstable (bad magic number)") and are an IndexError for a truncated variables
data file ("Read less bytes than requested"). Only when loading fails are the export's files
read one by one to find which it was, so a sound export is read once.
"""

import os

import tensorflow as tf

from tfxl.model_dir import SAVED_MODEL

VARIABLES = os.path.join("variables", "variables")  # the checkpoint prefix inside an export
# What TensorFlow raises for an export it cannot read: a proto that does not parse (OSError), a
# checkpoint it cannot open or read (OpError), a data file shorter than its index (IndexError).
_READ_ERRORS = (OSError, IndexError, ValueError, tf.errors.OpError)


def _reason(err):
    return " ".join(str(err).split()) or type(err).__name__


def damaged_file(path):
    """(file, why) of the first file of the export at `path` that cannot be read: its
    saved_model.pb, its variables index, a variables data file; None when every one reads."""
    from tensorflow.core.protobuf import saved_model_pb2
    graph = os.path.join(path, SAVED_MODEL)
    try:
        with tf.io.gfile.GFile(graph, "rb") as f:
            saved_model_pb2.SavedModel().ParseFromString(f.read())
    except Exception as err:  # DecodeError (protobuf), OSError, OpError: all unreadable
        return graph, f"does not parse as a SavedModel ({_reason(err)})"
    prefix = os.path.join(path, VARIABLES)
    index = f"{prefix}.index"
    if not tf.io.gfile.exists(index):
        return None  # an export without variables: nothing more to read
    try:
        reader = tf.train.load_checkpoint(prefix)
    except _READ_ERRORS as err:
        return index, f"is not a variables index ({_reason(err)})"
    data = sorted(tf.io.gfile.glob(f"{prefix}.data-*"))
    if not data:
        return f"{prefix}.data-00000-of-00001", "is missing"
    shown = data[0] if len(data) == 1 else f"{prefix}.data-* ({len(data)} files)"
    for name in reader.get_variable_to_shape_map():
        try:
            reader.get_tensor(name)
        except IndexError as err:  # a read past the end of a file shorter than the index says
            return shown, f"is shorter than its index says: truncated ({_reason(err)})"
        except _READ_ERRORS as err:
            return shown, f"cannot be read ({_reason(err)})"
    return None


def load_export(path):
    """`tf.saved_model.load(path)`; ValueError naming the damaged file (`damaged_file`) and what
    to do when the export cannot be read."""
    try:
        return tf.saved_model.load(path)
    except _READ_ERRORS as err:
        damaged = damaged_file(path)
        if damaged is None:  # every file reads: not damage (another TensorFlow's ops, say)
            raise ValueError(f"{path}: cannot load the SavedModel ({_reason(err)})") from None
        name, why = damaged
        raise ValueError(f"{path} is a damaged export: {name} {why}; copy or export it "
                         "again") from None
