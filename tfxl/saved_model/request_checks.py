"""In-graph checks of a request's tensors, run at the entry of every exported signature.

TF Serving feeds request tensors straight into the graph: nothing compares them with the
signature's shapes, and a wrong one would fail deep inside the model with an internal op error
(or, where shapes broadcast, not fail at all). A rule here is (ok, message): `checked` turns a
list of rules into assert ops that run one after the other before anything reads the inputs, so a
bad request gets one InvalidArgumentError naming the input, what the export expects and what it
received.

A shape test written with tf.shape/tf.rank/tf.size folds to True before it ever runs: they are
constants at trace time where the signature's shape (or rank) is static, and Grappler infers an
input's rank from what the ops consuming it require (StringSplit: a vector) and folds Rank.
`shape_of` therefore reads the shape with the raw Shape op through a serialize/parse round trip
(a few bytes), which neither tracing nor Grappler can see through (of an input of a complete
declared shape, a scalar, Grappler folds Shape itself: such an input goes through the round trip
first); tests feed such inputs.
TF orders only the asserts, not the computation of their predicates, so every predicate is
computable for inputs of any shape (no op in it can fail): a value test reads its input through
`flat` (a vector whatever the input's rank; `opaque` first for a declared scalar, whose static
shape [] Grappler would otherwise trust and reduce away).
"""

import tensorflow as tf


def opaque(x):
    """x itself, of a shape neither constant folding nor shape inference can see (a copy: only
    for small tensors)."""
    return tf.io.parse_tensor(tf.io.serialize_tensor(x), x.dtype)


def shape_of(x):
    """x's shape at run time, int32 [rank], opaque to constant folding and shape inference.

    Where x's declared shape is complete (a scalar input), Grappler replaces Shape(x) by a
    constant and folds the round trip after it, so x itself goes through `opaque` first.
    """
    if x.shape.is_fully_defined():
        x = opaque(x)
    return opaque(tf.raw_ops.Shape(input=x, out_type=tf.int32))


def flat(x):
    """x's values as a vector, whatever x's rank at run time (declared scalars: `opaque` first)."""
    return tf.reshape(opaque(x) if x.shape.rank == 0 else x, [-1])


def padded_shape(x, rank):
    """x's shape as int32 [rank], cut or zero-padded to `rank`: indexable whatever x's rank."""
    return tf.reshape(tf.concat([shape_of(x), tf.zeros([rank], tf.int32)], axis=0)[:rank], [rank])


def has_rank(x, rank):
    return tf.equal(tf.size(shape_of(x)), rank)


def shape_rule(what, x, expected, layout):
    """x has exactly the shape `expected` (ints or int32 scalars), described as `layout`."""
    expected = (tf.stack([tf.cast(d, tf.int32) for d in expected]) if expected
                else tf.zeros([0], tf.int32))
    rank = expected.shape[0]
    ok = tf.logical_and(has_rank(x, rank),
                        tf.reduce_all(tf.equal(padded_shape(x, rank), expected)))
    return ok, [f"{what} must have shape {layout} =", expected, "but got", shape_of(x)]


def tokens_rule(what, ids, length="T", min_length=1):
    """ids is [B, `length`] with B >= 1 and at least `min_length` tokens per row."""
    shape = padded_shape(ids, 2)
    ok = tf.logical_and(has_rank(ids, 2), tf.logical_and(shape[0] >= 1, shape[1] >= min_length))
    return ok, [f"{what} must have shape [B, {length}] with B >= 1 and {length} >= {min_length}, "
                "but got", shape_of(ids)]


def ids_rule(what, ids, vocab_size):
    """Every id is in [0, vocab_size)."""
    ids = flat(ids)
    ok = tf.reduce_all(tf.logical_and(ids >= 0, ids < vocab_size))
    return ok, [f"{what} must be token ids in [0, {vocab_size}), but got ids from",
                tf.reduce_min(ids), "to", tf.reduce_max(ids)]


def range_rule(what, x, ok, requirement):
    """`ok(values)` holds for every value of x (a bool tensor of the values' shape)."""
    values = flat(x)
    return tf.reduce_all(ok(values)), [f"{what} {requirement}, but got", values]


def finite_rule(what, x):
    """No NaN or infinity anywhere in x (a memory: the model would turn either into NaN)."""
    bad = tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(flat(x))), tf.int32))
    return tf.equal(bad, 0), [f"{what} must be finite, but got", bad, "non-finite values"]


def checked(rules, *tensors):
    """`tensors` (None stays None), to be read only after every rule passed, in order."""
    asserts = []
    for ok, message in rules:
        with tf.control_dependencies(asserts):  # only the first failing rule reports
            asserts = [tf.debugging.Assert(ok, message, summarize=8)]
    with tf.control_dependencies(asserts):
        return [None if t is None else tf.identity(t) for t in tensors]
