"""Writing a `SignatureSet` as a SavedModel and publishing it whole: as a numbered version under
an output directory (`publish_version`: tfxl-export, TF Serving's layout) or at a path itself
(`publish_at`: `model.export(path)`, as `keras.Model.export` writes).

Nothing is overwritten, and readers never see half an export: the SavedModel is built under a
temporary name beside its destination and published whole (`tfxl.files.StagedDirectory`,
saved_model.pb last on object stores), so TF Serving watching the output directory never loads
a version being written.
"""

import os

import tensorflow as tf

from tfxl.files import StagedDirectory
from tfxl.model_dir import SAVED_MODEL, write_export_record


def next_version(output_dir):
    """1 + the largest integer version under `output_dir` (1 when there is none).

    Only integer names are versions: a staging directory (".tmp-export-...") never counts. A
    version directory without saved_model.pb (an object-store publish killed midway, which no
    reader loads) still counts: its number is not reused, since TF Serving may have seen it.
    """
    if not tf.io.gfile.isdir(output_dir):
        return 1
    versions = [int(name.strip("/")) for name in tf.io.gfile.listdir(output_dir)
                if name.strip("/").isdigit()]
    return max(versions, default=0) + 1


def check_version(version):
    """A version is a positive integer (TF Serving's directory names); ValueError otherwise."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"--version must be a positive integer, got {version!r}")
    return version


def _exists_message(path):
    if tf.io.gfile.exists(os.path.join(path, SAVED_MODEL)):
        return f"{path} already exists; exports are never overwritten"
    return (f"{path} already exists without {SAVED_MODEL} (an export still being published, or "
            "one interrupted midway; delete it to reuse the version); exports are never "
            "overwritten")


def write_signatures(signatures, path, data_dir=None):
    """Writes the SavedModel of `signatures` (a `SignatureSet`) at `path` (the model's
    variables, the tokenizer's tables and constants, its `serving_default` signature also under
    that name), then the vocabulary record (`tfxl.model_dir`; a classifier's label names too).

    `tf.saved_model.save` itself rather than `keras.export.ExportArchive`: the archive traces
    every signature twice (once to list the variables it uses; once more inside the save, whose
    tracing context differs), and tracing is nearly all of an export's time. Here each
    signature is traced once, inside the save, and each `shared` loop once for all the
    signatures that run it.
    """
    root = tf.Module()
    # The tf.Variables themselves (`.value` of a Keras variable on TensorFlow): what the traced
    # signatures capture, so the saver maps each capture to the one variable it restores.
    root.model_variables = [variable.value for variable in signatures.model.variables]
    if signatures.tokenizer is not None:
        root.tokenizer = signatures.tokenizer  # its lookup tables and constants
    for name, function in signatures.functions.items():
        setattr(root, name, function)
    default = signatures.functions[signatures.serving_default]
    tf.saved_model.save(root, path, signatures={**signatures.functions,
                                                "serving_default": default})
    write_export_record(path, signatures.model.config.vocab_size,
                        signatures.tokenizer.vocab_sha256 if signatures.tokenizer is not None
                        else None, data_dir, **signatures.export_record())


def describe_saved_model(path, published_at=None):
    """The signatures of the SavedModel at `path` as written, one line each:
    `name(input: dtype [shape], ...) -> output: dtype [shape], ...` (-1: any size), under a
    first line naming where it is: `published_at` when `path` is where it is being built."""
    from tensorflow.core.protobuf import saved_model_pb2
    saved = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(os.path.join(path, SAVED_MODEL), "rb") as f:
        saved.ParseFromString(f.read())

    def tensors(infos):
        return ", ".join(f"{name}: {tf.dtypes.as_dtype(info.dtype).name} "
                         f"{[dim.size for dim in info.tensor_shape.dim]}"
                         for name, info in sorted(infos.items()))

    lines = [f"Saved the SavedModel at {published_at or path}; its signatures:"]
    for name, sig in sorted(saved.meta_graphs[0].signature_def.items()):
        if not name.startswith("__"):  # TF's own (__saved_model_init_op)
            lines.append(f"  {name}({tensors(sig.inputs)}) -> {tensors(sig.outputs)}")
    return "\n".join(lines)


def publish_version(signatures, output_dir, version=None, data_dir=None):
    """Writes `signatures` (a `SignatureSet`) as `<output_dir>/<version>/`, published whole
    (module docstring); returns its path.

    version: a positive integer, default the next free one (`next_version`); an existing
    version directory is never overwritten. data_dir: where the tokenizer came from, recorded
    with its vocabulary hash in assets.extra/tfxl_data.json (`tfxl.model_dir`).
    """
    if version is not None:
        check_version(version)
    if tf.io.gfile.exists(output_dir) and not tf.io.gfile.isdir(output_dir):
        raise ValueError(f"--output_dir={output_dir} is a file, not a directory")
    number = next_version(output_dir) if version is None else version
    path = os.path.join(output_dir, str(number))
    if tf.io.gfile.exists(path):
        raise ValueError(f"{_exists_message(path)} (pick another --version)")
    with StagedDirectory(path, "export") as staged:
        write_signatures(signatures, staged.path, data_dir)
        while True:
            try:
                staged.publish(last=(SAVED_MODEL,))
                return path
            except FileExistsError:
                if version is not None:  # given: never another one
                    raise ValueError(f"{_exists_message(path)} (pick another --version)") \
                        from None
                # Another export took this number meanwhile: the next free one.
                path = os.path.join(output_dir, str(next_version(output_dir)))


def publish_at(signatures, filepath, verbose=None):
    """Writes `signatures` (a `SignatureSet`) at `filepath` itself (no version directory),
    published whole and never over an existing file or non-empty directory. verbose (default
    True, as in Keras) prints the signatures."""
    filepath = os.fspath(filepath)
    message = (f"{filepath} already exists and is not an empty directory; exports are never "
               "overwritten")
    if tf.io.gfile.exists(filepath) and (not tf.io.gfile.isdir(filepath)
                                         or tf.io.gfile.listdir(filepath)):
        raise ValueError(message)
    with StagedDirectory(filepath, "export") as staged:
        write_signatures(signatures, staged.path)
        # Read where it is built, said once it is published: the staging path is gone by then.
        described = describe_saved_model(staged.path, published_at=filepath)
        try:
            staged.publish(last=(SAVED_MODEL,))
        except FileExistsError:
            raise ValueError(message) from None
    if verbose or verbose is None:
        print(described)
