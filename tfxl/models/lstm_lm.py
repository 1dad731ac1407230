"""A multi-layer LSTM language model (Hochreiter & Schmidhuber 1997), the recurrent baseline the
paper compares Transformer-XL with, trained with truncated back-propagation through time: each
layer's state is carried from one segment to the next without gradient, and reset where a
stream's document restarts.

Shape glossary: B batch, T segment length, L layers, V vocabulary size, D model size (the
embedding's width and every layer's units).

Why a scan of its own rather than `keras.layers.LSTM`: the input projection of all T steps is
one matmul before the loop, so the loop carries only h @ W_h (4D x D per step); the loop is
`keras.ops.scan` (TensorFlow's while loop, which tf.function and XLA compile; JAX's lax.scan;
a Python loop on PyTorch), so the same ops run on every backend, where keras.layers.LSTM picks a
cuDNN kernel on some devices only; and the state in and out of a segment is plain tensors,
which the memory holders carry (tfxl.layers.memory.baselines.RecurrentState).
"""

import math

import keras
from keras import ops

from tfxl.layers.dropout import HashDropout
from tfxl.layers.memory.baselines import RecurrentState
from tfxl.models.baseline import BaselineLM


def lstm_step(projected_input, hidden, cell, recurrent_kernel):
    """One LSTM step: gates z = x W_x + b (given, [B, 4D]) + h W_h, in the order input, forget,
    candidate, output (Keras' and PyTorch's); returns the new (h, c), [B, D] each."""
    gates = projected_input + ops.matmul(hidden, recurrent_kernel)
    i, f, g, o = ops.split(gates, 4, axis=-1)
    cell = ops.sigmoid(f) * cell + ops.sigmoid(i) * ops.tanh(g)
    return ops.sigmoid(o) * ops.tanh(cell), cell


@keras.saving.register_keras_serializable(package="tfxl")
class LSTMLayer(keras.layers.Layer):
    """One LSTM layer over a segment, from a given state.

    Call: inputs [B, T, D_in], state (h [B, D], c [B, D]), optional step_valid [B, T] bool
    (False: the step is padding and leaves the state as it was) -> (outputs [B, T, D],
    (h, c) after the last step).

    Initialised as PyTorch's LSTM, U(-1/sqrt(D), 1/sqrt(D)), with the forget gate's bias 1
    (Jozefowicz et al. 2015) so that a fresh cell keeps its state.
    """

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = int(units)

    def build(self, inputs_shape):
        bound = 1.0 / math.sqrt(self.units)
        init = keras.initializers.RandomUniform(-bound, bound)
        d, width = self.units, inputs_shape[-1]
        self.input_kernel = self.add_weight(name="input_kernel", shape=(width, 4 * d),
                                            initializer=init)
        self.recurrent_kernel = self.add_weight(name="recurrent_kernel", shape=(d, 4 * d),
                                                initializer=init)
        self.bias = self.add_weight(name="bias", shape=(4 * d,), initializer=lambda shape, dtype:
                                    ops.concatenate([ops.zeros((d,), dtype), ops.ones((d,), dtype),
                                                     ops.zeros((2 * d,), dtype)]))

    def call(self, inputs, state, step_valid=None):
        hidden, cell = state
        # Every step's input projection at once: [T, B, 4D], time-major for the scan.
        projected = ops.transpose(ops.matmul(inputs, self.input_kernel) + self.bias, (1, 0, 2))
        recurrent_kernel = ops.convert_to_tensor(self.recurrent_kernel)
        # Each step's output is its whole state: Keras' TensorFlow scan writes outputs of the
        # carry's structure only; the cells are what the backward pass keeps anyway.
        if step_valid is None:
            def step(carry, x):
                new = lstm_step(x, *carry, recurrent_kernel)
                return new, new
            steps = projected
        else:
            def step(carry, x):
                x, keep = x
                h, c = lstm_step(x, *carry, recurrent_kernel)
                keep = keep[:, None]
                h, c = ops.where(keep, h, carry[0]), ops.where(keep, c, carry[1])
                return (h, c), (h, c)
            steps = (projected, ops.transpose(ops.cast(step_valid, "bool"), (1, 0)))
        (hidden, cell), (outputs, _) = ops.scan(step, (hidden, cell), steps)
        return ops.transpose(outputs, (1, 0, 2)), (hidden, cell)

    def compute_output_spec(self, inputs, state, step_valid=None):
        batch, length = inputs.shape[0], inputs.shape[1]
        h = keras.KerasTensor((batch, self.units), self.compute_dtype)
        return keras.KerasTensor((batch, length, self.units), self.compute_dtype), (h, h)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


@keras.saving.register_keras_serializable(package="tfxl")
class LSTMLM(BaselineLM):
    """The LSTM language model (`config.architecture == "lstm"`): the adaptive embedding,
    n_layer LSTM layers of d_model units with dropout between them, the adaptive softmax.

    Reads from the config: vocab_size, n_layer, d_model, the adaptive embedding and softmax
    fields, dropout (on the embeddings, between layers and on the last layer's output),
    init_std and proj_init_std (embedding and softmax) and tgt_len (the segment length, that of
    truncated back-propagation). The attention fields (n_head, d_head, d_inner, dropatt,
    pre_lnorm, untie_r, layer_norm_epsilon) and the memory fields (mem_len, clamp_len,
    same_length and their eval_* fields) mean nothing to it: its memory is the state, which
    stands for every token read since the row's document began.

    Call args:
      token_ids: int [B, T].
      memory: a `RecurrentState` (`init_memory`), or None for the zero state.
      reset: optional bool [B], rows whose state is zeroed first (a new document).
      targets: optional int [B, T].
      training: enables dropout.
      segment_valid: optional bool [B, T], False at padding tokens, which leave the state as it
        was.
      clamp_len, same_length, position_keys: taken for the common contract, ignored.
    Returns:
      (nll [B, T] float32 when `targets` is given, else log_probs [B, T, V] float32; the state
      after the segment, without gradient).

    Examples:

    ```python
    import numpy as np
    import tfxl
    from tfxl.models import LSTMLM

    model = LSTMLM(tfxl.get_preset("tiny", vocab_size=258, architecture="lstm"))
    tokens = np.random.default_rng(0).integers(0, 258, size=(2, 17))
    state = model.init_memory(batch_size=2)
    nll, state = model(tokens[:, :8], state, targets=tokens[:, 1:9])       # [2, 8]
    log_probs, state = model(tokens[:, 8:16], state)                      # [2, 8, 258]
    ```
    """

    architecture = "lstm"
    default_name = "lstm_lm"

    def build_layers(self):
        c, policy = self.config, self.dtype_policy
        for i in range(c.n_layer):
            layer = LSTMLayer(c.d_model, name=f"lstm_{i}", dtype=policy)
            layer.build((None, None, c.d_model))
            # One attribute per layer (not a list): tf.train.Checkpoint tracks attributes only.
            setattr(self, f"lstm_{i}", layer)
            setattr(self, f"dropout_{i}", HashDropout(c.dropout, name=f"dropout_{i}",
                                                      dtype=policy))
        self.embedding_dropout = HashDropout(c.dropout, name="embedding_dropout", dtype=policy)

    def init_memory(self, batch_size, mem_len=None, dtype=None):
        """The zero state of `batch_size` rows (mem_len is Transformer-XL's; ignored)."""
        del mem_len
        c = self.config
        return RecurrentState.empty(batch_size, c.n_layer, c.d_model, dtype or self.compute_dtype)

    def init_key_value_ring(self, batch_size, tgt_len=None, mem_len=None, dtype=None):
        """The zero state: evaluation carries the state as training does."""
        del tgt_len
        return self.init_memory(batch_size, mem_len, dtype)

    def call(self, token_ids, memory=None, reset=None, targets=None, training=None,
             clamp_len=None, same_length=None, segment_valid=None, position_keys=None):
        del clamp_len, same_length, position_keys
        if memory is None:
            memory = self.init_memory(ops.shape(token_ids)[0])
        memory = memory.reset(reset).with_invalid_rows_zeroed()
        hidden = self.embedding_dropout(self.embedding(token_ids), training=training)
        states, cells = [], []
        for i in range(self.config.n_layer):
            state = (ops.cast(memory.hidden[:, i], hidden.dtype),
                     ops.cast(memory.cell[:, i], hidden.dtype))
            hidden, (h, c) = getattr(self, f"lstm_{i}")(hidden, state, segment_valid)
            hidden = getattr(self, f"dropout_{i}")(hidden, training=training)
            states.append(h)
            cells.append(c)
        new_memory = RecurrentState(
            ops.stop_gradient(ops.cast(ops.stack(states, axis=1), memory.hidden.dtype)),
            ops.stop_gradient(ops.cast(ops.stack(cells, axis=1), memory.cell.dtype)),
            ops.ones_like(ops.cast(memory.valid, "bool")))
        return self.head(hidden, targets), new_memory
