"""The vanilla Transformer language model the paper compares Transformer-XL with (Al-Rfou et al.
2018; Dai et al. 2019, section 3.1 and Figure 1).

Sinusoidal absolute positions added to the (adaptive) embeddings, causal multi-head attention
inside a fixed context of tgt_len tokens, no memory in training. Evaluation slides the window:
every token is scored by a forward pass over the tgt_len - 1 tokens before it and itself, so it
is read with as much context as the last position of a training segment, never more (the
paper's vanilla evaluation: the window shifted by one, the last position scored). Its memory
is therefore the previous tokens' ids (`TokenWindow`), not hidden states.

Shape glossary: B batch, T segment length, W = tgt_len (the window), M = W - 1 (the ids kept),
R = B x T windows, V vocabulary size, D model size, N heads, H head size.
"""

import math

import keras
from keras import ops

from tfxl.layers.dropout import HashDropout
from tfxl.layers.feed_forward import PositionwiseFeedForward
from tfxl.layers.memory.baselines import TokenWindow
from tfxl.layers.relative_attention import build_attention_parts
from tfxl.models.baseline import BaselineLM, sinusoid


@keras.saving.register_keras_serializable(package="tfxl")
class CausalSelfAttention(keras.layers.Layer):
    """Multi-head self-attention of a window on itself under a mask, with the residual and
    LayerNorm of the Transformer-XL block (post-LN, or pre-LN with `pre_lnorm`).

    Call: hidden [R, W, D], mask [R, 1, W, W] bool (True: the query sees the key) -> [R, W, D].
    """

    def __init__(self, d_model, n_head, d_head, dropout=0.0, dropatt=0.0, pre_lnorm=False,
                 init_std=0.02, layer_norm_epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.n_head, self.d_head = int(d_model), int(n_head), int(d_head)
        self.dropout, self.dropatt = float(dropout), float(dropatt)
        self.pre_lnorm, self.init_std = bool(pre_lnorm), float(init_std)
        self.layer_norm_epsilon = float(layer_norm_epsilon)

    def build(self, hidden_shape):
        build_attention_parts(self, hidden_shape, ("query", "key", "value"))

    def call(self, hidden, mask, training=None):
        x = self.layer_norm(hidden) if self.pre_lnorm else hidden
        query = ops.einsum("bwd,dnh->bnwh", x, self.query_kernel)
        key = ops.einsum("bwd,dnh->bnwh", x, self.key_kernel)
        value = ops.einsum("bwd,dnh->bnwh", x, self.value_kernel)
        # Softmax in float32 whatever the compute dtype (as Transformer-XL's attention).
        score = ops.cast(ops.einsum("bnqh,bnkh->bnqk", query, key), "float32")
        score = ops.where(mask, score / math.sqrt(self.d_head), -1e30)
        if score.shape[-1] == 1:  # a window of one token: probability 1, and no Keras warning
            probs = ops.ones_like(score, dtype=query.dtype)
        else:
            probs = ops.cast(ops.softmax(score, axis=-1), query.dtype)
        probs = self.attention_dropout(probs, training=training)
        context = ops.einsum("bnqk,bnkh->bqnh", probs, value)
        output = self.output_dropout(ops.einsum("bqnh,nhd->bqd", context, self.output_kernel),
                                     training=training)
        return hidden + output if self.pre_lnorm else self.layer_norm(hidden + output)

    def compute_output_shape(self, hidden_shape, mask_shape=None):
        return hidden_shape

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "n_head": self.n_head,
                "d_head": self.d_head, "dropout": self.dropout, "dropatt": self.dropatt,
                "pre_lnorm": self.pre_lnorm, "init_std": self.init_std,
                "layer_norm_epsilon": self.layer_norm_epsilon}


@keras.saving.register_keras_serializable(package="tfxl")
class TransformerLM(BaselineLM):
    """The vanilla Transformer language model (`config.architecture == "transformer"`).

    Reads from the config: vocab_size, n_layer, d_model, n_head, d_head, d_inner, the adaptive
    embedding and softmax fields, dropout, dropatt, pre_lnorm, init_std, proj_init_std,
    layer_norm_epsilon and tgt_len, the window W (the context of every position, training's
    segment length). mem_len, clamp_len, same_length, untie_r and their eval_* fields mean
    nothing to it; eval_tgt_len is how many positions one evaluation call scores.

    Call args:
      token_ids: int [B, T].
      memory: None (training: the segment alone, T <= tgt_len; the new memory is None), or a
        `TokenWindow` (`init_key_value_ring`, evaluation): every position is then scored by a
        forward pass over the M = tgt_len - 1 tokens before it (those of the window and of the
        segment, as many as the row has since its document began) and itself, and the new
        memory holds the last M ids.
      reset: optional bool [B], rows whose window is emptied first (a new document).
      targets: optional int [B, T].
      training: enables dropout.
      segment_valid: optional bool [B, T], False at padding tokens, which no position sees.
      clamp_len, same_length, position_keys: taken for the common contract, ignored.
    Returns:
      (nll [B, T] float32 when `targets` is given, else log_probs [B, T, V] float32; the new
      memory).

    Examples:

    ```python
    import numpy as np
    import tfxl
    from tfxl.models import TransformerLM

    config = tfxl.get_preset("tiny", vocab_size=258, architecture="transformer", tgt_len=16)
    model = TransformerLM(config)
    tokens = np.random.default_rng(0).integers(0, 258, size=(2, 17))
    nll, _ = model(tokens[:, :16], targets=tokens[:, 1:], training=True)   # [2, 16]
    window = model.init_key_value_ring(batch_size=2)
    log_probs, window = model(tokens[:, :4], window)                      # [2, 4, 258]
    ```
    """

    architecture = "transformer"
    default_name = "transformer_lm"

    def build_layers(self):
        c, policy = self.config, self.dtype_policy
        self.embedding_dropout = HashDropout(c.dropout, name="embedding_dropout", dtype=policy)
        self.output_dropout = HashDropout(c.dropout, name="output_dropout", dtype=policy)
        hidden_shape = (None, None, c.d_model)
        for i in range(c.n_layer):
            attention = CausalSelfAttention(
                c.d_model, c.n_head, c.d_head, c.dropout, c.dropatt, c.pre_lnorm, c.init_std,
                c.layer_norm_epsilon, name=f"attention_{i}", dtype=policy)
            attention.build(hidden_shape)
            feed_forward = PositionwiseFeedForward(
                c.d_model, c.d_inner, c.dropout, c.pre_lnorm, c.init_std, c.layer_norm_epsilon,
                name=f"feed_forward_{i}", dtype=policy)
            feed_forward.build(hidden_shape)
            # One attribute per layer (not a list): tf.train.Checkpoint tracks attributes only.
            setattr(self, f"attention_{i}", attention)
            setattr(self, f"feed_forward_{i}", feed_forward)

    @property
    def window(self):
        """W: the tokens every position is read with, itself included (tgt_len)."""
        return self.config.tgt_len

    def init_memory(self, batch_size=None, mem_len=None, dtype=None):
        """None: training carries nothing from one segment to the next."""
        del batch_size, mem_len, dtype
        return None

    def init_key_value_ring(self, batch_size, tgt_len=None, mem_len=None, dtype=None):
        """An empty `TokenWindow` of M = tgt_len - 1 ids (the config's training tgt_len, the
        model's context; the arguments, which set Transformer-XL's evaluation memory, do not
        change it), for evaluation."""
        del tgt_len, mem_len, dtype
        return TokenWindow.empty(batch_size, self.window - 1)

    def read_windows(self, token_ids, valid, training=None):
        """Hidden states [R, W, D] of windows `token_ids` [R, W] whose tokens `valid` [R, W]
        holds (False: no token there). A token's position is the number of valid tokens before
        it in its window, so a window that starts at a document's beginning reads as a
        training segment does."""
        c = self.config
        valid = ops.cast(valid, "bool")
        positions = ops.maximum(ops.cumsum(ops.cast(valid, "int32"), axis=1) - 1, 0)
        hidden = self.embedding(token_ids)
        hidden = hidden + sinusoid(positions, c.d_model, hidden.dtype)
        hidden = self.embedding_dropout(hidden, training=training)
        width = ops.shape(token_ids)[1]
        query, key = ops.arange(width)[:, None], ops.arange(width)[None, :]
        # A query sees the valid keys up to itself, and always itself: a slot without a token
        # (whose output is never read) then has a key, and its softmax no empty row.
        sees = ops.logical_or(ops.logical_and(valid[:, None, None, :], (key <= query)[None, None]),
                              (key == query)[None, None])
        for i in range(c.n_layer):
            hidden = getattr(self, f"attention_{i}")(hidden, sees, training=training)
            hidden = getattr(self, f"feed_forward_{i}")(hidden, training=training)
        return self.output_dropout(hidden, training=training)

    def call(self, token_ids, memory=None, reset=None, targets=None, training=None,
             clamp_len=None, same_length=None, segment_valid=None, position_keys=None):
        del clamp_len, same_length, position_keys
        token_ids = ops.cast(token_ids, "int32")
        batch, segment_len = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        if segment_valid is None:
            segment_valid = ops.ones((batch, segment_len), "bool")
        if memory is None:
            if token_ids.shape[1] is not None and token_ids.shape[1] > self.window:
                raise ValueError(f"TransformerLM: a segment of {token_ids.shape[1]} tokens "
                                 f"without a memory exceeds its context of tgt_len="
                                 f"{self.window}; pass init_key_value_ring(batch) as memory "
                                 "to score every token on its own window")
            hidden = self.read_windows(token_ids, segment_valid, training=training)
            return self.head(hidden, targets), None
        memory = memory.reset(reset)
        ids = ops.concatenate([ops.cast(memory.token_ids, "int32"), token_ids], axis=1)
        valid = ops.concatenate([ops.cast(memory.valid, "bool"),
                                 ops.cast(segment_valid, "bool")], axis=1)
        # Window t is ids[t : t + W]: the M ids before position t of the segment, and t itself.
        index = ops.arange(segment_len)[:, None] + ops.arange(self.window)[None, :]  # [T, W]
        windows = ops.reshape(ops.take(ids, index, axis=1), (-1, self.window))
        windows_valid = ops.reshape(ops.take(valid, index, axis=1), (-1, self.window))
        hidden = self.read_windows(windows, windows_valid, training=training)[:, -1]  # [R, D]
        hidden = ops.reshape(hidden, (batch, segment_len, self.config.d_model))
        return self.head(hidden, targets), memory.updated(token_ids, segment_valid)
