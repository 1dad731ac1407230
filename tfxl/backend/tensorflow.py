"""TensorFlow's answers to the model code's backend questions (`tfxl.backend.current()`).

Keras variables are `tf.Variable`s here, so `tf.train.Checkpoint` tracks them directly; checks
are in-graph assertions (an InvalidArgumentError, as the SavedModel signatures have always
raised), and the ops with no static-shape `keras.ops` equivalent are TensorFlow's own.
"""

import functools

import keras
import tensorflow as tf

VARIABLES_ARE_TRACKABLE = True
# The adaptive softmax evaluates a tail cluster only on the tokens whose target falls into it: a
# dynamic gather, whose shape XLA bounds by B*T with its dynamic padder (it compiles for TPU).
SPARSE_TAIL = True


def is_concrete(x):
    return tf.executing_eagerly()


def target_log_probs(head, index):
    """head [B, T, C] gathered at index [B, T]: the batched gather the NLL has always used."""
    return tf.gather(head, index, axis=-1, batch_dims=2)


def wrapped_uint32(h):
    """uint32 is 32 bits here: products already wrap modulo 2^32."""
    return h


def kth_largest(logits, k):
    """[B, 1]: each row's k-th largest logit, k a scalar tensor (the signatures' top_k): top_k
    takes a traced k without sorting the row (1.7 ms against 29 ms for a sort at V = 267k)."""
    return tf.math.top_k(logits, k=k).values[:, -1:]


def positive_length(n, message):
    """A tensor length checked >= 1 in the graph."""
    n = tf.cast(n, tf.int32)
    tf.debugging.assert_positive(n, message=message)
    return n


def checked_finite(log_probs, ok, message):
    """`log_probs` after an in-graph assertion that every row is `ok`."""
    with tf.control_dependencies([tf.debugging.Assert(tf.reduce_all(ok), [message])]):
        return tf.identity(log_probs)


def raise_if_any(failed, message):
    """Nothing to do after the loop: `checked_finite` has asserted inside it."""
    del failed, message


def compiled_generate(loop, model):
    """`loop(ids, n, temperature, top_k, top_p, seed)` as one tf.function of any batch and
    prompt length: one trace per memory length, not one per prompt shape (each costs seconds)."""
    del model  # its variables are captured by the trace
    scalars = [tf.TensorSpec([], dtype) for dtype in (tf.int32, tf.float32, tf.int32,
                                                      tf.float32, tf.int32)]
    return tf.function(loop, input_signature=[tf.TensorSpec([None, None], tf.int32), *scalars])


def hub_generate_function(task):
    """keras-hub's `generate_step` as a tf.function whose traces count on their own.

    keras-hub makes a new tf.function of `generate_step` at every compile, traced once per
    input shape. TensorFlow counts traces per code object across all of them and, by the fifth
    sampler, warns of excessive retracing; tracing a fresh `functools.partial` (no code object:
    counted by itself) keeps each function's count its own."""
    return tf.function(functools.partial(task.generate_step),
                       jit_compile=getattr(task, "jit_compile", True))


def checked_rows(data, batch_size, message):
    """A tf.data.Dataset with each batch's row count asserted in its pipeline (other data as it
    is). In a traced step such assertions come too late: Grappler infers the step's unknown row
    count from the memory's and folds the shape ops, so a short batch fails first in a
    gradient's reshape, naming neither."""
    if not isinstance(data, tf.data.Dataset):
        return data

    def check(*element):
        element = element[0] if len(element) == 1 else element
        checks = [tf.debugging.assert_equal(tf.shape(t)[0], batch_size, message=message)
                  for t in keras.tree.flatten(element)]
        with tf.control_dependencies(checks):
            return keras.tree.map_structure(tf.identity, element)

    return data.map(check)


__all__ = ["VARIABLES_ARE_TRACKABLE", "SPARSE_TAIL", "is_concrete", "target_log_probs",
           "wrapped_uint32", "kth_largest", "positive_length", "checked_finite", "raise_if_any",
           "compiled_generate", "hub_generate_function", "checked_rows"]
