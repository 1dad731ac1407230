"""Re-cutting a batched segment dataset to another segment length (evaluation settings).

Shape glossary: b batch rows (slots), T the data's segment length, T' the new one.

The paper evaluates with other segment lengths than it trains with (enwik8: train 512, eval 80).
Each batch row of an `input_fn` dataset is a slot that reads consecutive segments, so a row's
tokens form one continuous sequence and can be cut again at any length: time-major rows of [b]
tokens are re-batched T' at a time; the final short segment is padded with target_mask 0.
A `reset` must stay at a segment start (the model clears memory only there): if a row moves to a
new stream or document at a real token inside a new segment, the dataset raises an error saying so.
"""

import tensorflow as tf

_TOKEN_FEATURES = ("inputs", "targets", "target_mask")


def rechunk(dataset, tgt_len, replicas=1):
    """[b, T] segment batches -> [b, tgt_len] segment batches of the same token streams.

    replicas: consecutive elements are the batches of this many replicas in turn (one input
    pipeline feeding several local replicas, as `distribute_datasets_from_function` reads it), so
    a row continues `replicas` elements later. The output keeps that order.
    """
    spec = dataset.element_spec
    rows = spec["inputs"].shape[0]
    if rows is None:
        raise ValueError("rechunk needs a static batch size (drop_remainder batches)")
    if replicas > 1:  # re-cut the replicas' b rows of each step as one batch of replicas * b rows
        def merge(features):
            return {k: tf.reshape(v, (replicas * rows,) + tuple(v.shape[2:]))
                    for k, v in features.items()}

        def split(features):
            return tf.data.Dataset.from_tensor_slices(
                {k: tf.reshape(v, (replicas, rows) + tuple(v.shape[1:]))
                 for k, v in features.items()})

        merged = dataset.batch(replicas, drop_remainder=True).map(merge)
        return rechunk(merged, tgt_len).flat_map(split)

    def to_time_major(features):
        steps = tf.shape(features["inputs"])[1]
        starts = tf.one_hot(tf.zeros_like(features["reset"]), steps, dtype=tf.int32)
        out = {k: tf.transpose(features[k]) for k in _TOKEN_FEATURES}
        out["reset"] = tf.transpose(starts * features["reset"][:, None])
        return out  # each [T, b]

    def pad_to_length(features):
        have = tf.shape(features["inputs"])[0]
        padding = [[0, tgt_len - have], [0, 0]]
        return {k: tf.ensure_shape(tf.pad(v, padding), (tgt_len, rows))
                for k, v in features.items()}

    def to_batch_major(features):
        out = {k: tf.transpose(features[k]) for k in _TOKEN_FEATURES}
        resets = tf.transpose(features["reset"])  # [b, T']
        inside = tf.reduce_any((resets[:, 1:] > 0) & (out["target_mask"][:, 1:] > 0))
        check = tf.debugging.Assert(tf.logical_not(inside), [
            f"a stream or document starts inside a re-cut segment of length {tgt_len}: use an "
            f"evaluation batch size equal to the data's num_streams, or a tgt_len that divides "
            f"the data's"])
        with tf.control_dependencies([check]):
            out["reset"] = tf.identity(resets[:, 0])
        return out

    return (dataset.map(to_time_major).unbatch().batch(tgt_len).map(pad_to_length)
            .map(to_batch_major).prefetch(tf.data.AUTOTUNE))
