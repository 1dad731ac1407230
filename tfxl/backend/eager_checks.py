"""What JAX and PyTorch answer alike (jax.py and torch.py take these): every shape static, the
kernels `keras.ops`, and a check a ValueError where the values are concrete.

Inside a compiled loop (JAX's lax.while_loop, eager calls included) nothing can raise: the
generation loop marks such rows and `raise_if_any` raises once their values are concrete.
"""

from keras import ops

VARIABLES_ARE_TRACKABLE = False  # a checkpoint reads them by the paths TensorFlow names them
# The adaptive softmax evaluates each tail cluster on every token, in chunks of bounded memory.
SPARSE_TAIL = False


def target_log_probs(head, index):
    """head [B, T, C] at index [B, T]."""
    return ops.take_along_axis(head, index[..., None], axis=-1)[..., 0]


def kth_largest(logits, k):
    """[B, 1]: each row's k-th largest logit, read from a sort (top_k needs a static k here)."""
    return ops.take(ops.flip(ops.sort(logits, axis=-1), axis=-1), k - 1, axis=-1)[:, None]


def positive_length(n, message):
    """A length that is a shape here, concrete by the time it is asked."""
    n = int(n)
    if n < 1:
        raise ValueError(f"{message}, got {n}")
    return n


def checked_finite(log_probs, ok, message, is_concrete):
    if is_concrete(ok) and not ops.convert_to_numpy(ops.all(ok)):
        raise ValueError(message)
    return log_probs


def raise_if_any(failed, message, is_concrete):
    if is_concrete(failed) and ops.convert_to_numpy(ops.any(failed)):
        raise ValueError(message)


def hub_generate_function(task):
    """None: keras-hub's own."""
    del task


def checked_rows(data, batch_size, message):
    """The data as it is: every batch's shape is known when its step is traced."""
    del batch_size, message
    return data
