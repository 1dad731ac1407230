"""The Transformer-XL backbone: token ids + memory -> hidden states + new memory.

Shape glossary: B batch (streams), T segment length, L layers, M memory length, K = M + T,
D model size, N heads, H head size. Public tensors are batch-major.
"""

import keras
from keras import ops

from tfxl.config import TransfoXLConfig
from tfxl.layers.adaptive_embedding import AdaptiveEmbedding
from tfxl.layers.dropout import HashDropout
from tfxl.layers.memory import (STATES, VALID, attention_mask, empty_memory, reset_rows,
                                updated_memory)
from tfxl.layers.relative_position import RelativePositionEncoding
from tfxl.layers.transformer_xl_block import TransformerXLBlock


def as_config(config):
    return config if isinstance(config, TransfoXLConfig) else TransfoXLConfig.from_dict(config)


def init_memory(config, batch_size, mem_len=None, dtype="float32"):
    """An empty memory for `config`: `batch_size` rows, `mem_len` slots (default config.mem_len)."""
    mem_len = config.mem_len if mem_len is None else mem_len
    return empty_memory(batch_size, config.n_layer, mem_len, config.d_model, dtype)


@keras.saving.register_keras_serializable(package="tfxl")
class TransfoXLBackbone(keras.layers.Layer):
    """Stateless Transformer-XL: memory goes in and comes out as tensors.

    Call args:
      token_ids: int [B, T].
      memory: {"states": [B, L, M, D], "valid": [B, M] bool} or None for an empty memory of
        `config.mem_len` slots. M is taken from the memory given, so evaluation may use a longer
        memory than training.
      reset: optional bool [B]: rows whose memory is cleared before this segment (a new document).
      segment_valid: optional bool [B, T]: False marks padding tokens (e.g. left-padded prompts of
        different lengths), which no query attends to and the memory does not keep.
      training: enables dropout.
      clamp_len, same_length: override the config for this call (evaluation uses the paper's
        longer settings with the same weights).
    Returns:
      (hidden [B, T, D], new memory of the same shapes as the one used).
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.config = as_config(config)

    def build(self, ids_shape=None):
        c = self.config
        policy = self.dtype_policy
        self.embedding = AdaptiveEmbedding(
            c.vocab_size, c.embed_dim, c.d_model, c.cutoffs, c.div_val, c.proj_same_dim,
            c.init_std, c.proj_init_std, name="embedding", dtype=policy)
        self.embedding.build(ids_shape)
        self.position_encoding = RelativePositionEncoding(c.d_model, c.clamp_len,
                                                          name="position_encoding", dtype=policy)
        self.embedding_dropout = HashDropout(c.dropout, name="embedding_dropout")
        self.position_dropout = HashDropout(c.dropout, name="position_dropout")
        self.output_dropout = HashDropout(c.dropout, name="output_dropout")
        hidden_shape = (None, None, c.d_model)
        for i in range(c.n_layer):
            block = TransformerXLBlock(
                c.d_model, c.n_head, c.d_head, c.d_inner, c.dropout, c.dropatt, c.pre_lnorm,
                c.init_std, c.layer_norm_epsilon, name=f"block_{i}", dtype=policy)
            block.build(hidden_shape)
            # One attribute per block (not a list): tf.train.Checkpoint tracks attributes only.
            setattr(self, f"block_{i}", block)
        # u and v: shared by all layers, or one pair per layer with untie_r.
        bias_shape = ((c.n_layer,) if c.untie_r else ()) + (c.n_head, c.d_head)
        init = keras.initializers.RandomNormal(stddev=c.init_std)
        self.content_bias = self.add_weight(name="content_bias", shape=bias_shape,
                                            initializer=init)
        self.position_bias = self.add_weight(name="position_bias", shape=bias_shape,
                                             initializer=init)

    @property
    def blocks(self):
        return [getattr(self, f"block_{i}") for i in range(self.config.n_layer)]

    def init_memory(self, batch_size, mem_len=None, dtype=None):
        """An empty memory for `batch_size` rows and `mem_len` slots (default: config.mem_len)."""
        return init_memory(self.config, batch_size, mem_len, dtype or self.compute_dtype)

    def call(self, token_ids, memory=None, reset=None, training=None, clamp_len=None,
             same_length=None, segment_valid=None):
        c = self.config
        same_length = c.same_length if same_length is None else bool(same_length)
        segment_len = token_ids.shape[1] if token_ids.shape[1] is not None else (
            ops.shape(token_ids)[1])
        if memory is None:
            memory = self.init_memory(ops.shape(token_ids)[0])
        memory = reset_rows(memory, reset)
        mem_len = memory[STATES].shape[2]

        mask = attention_mask(memory[VALID], segment_len, same_length, segment_valid)
        position = self.position_encoding(key_length=mem_len + segment_len, clamp_len=clamp_len)
        position = self.position_dropout(position, training=training)
        hidden = self.embedding_dropout(self.embedding(token_ids), training=training)
        layer_inputs = []
        for i, block in enumerate(self.blocks):
            layer_inputs.append(hidden)
            u = self.content_bias[i] if c.untie_r else self.content_bias
            v = self.position_bias[i] if c.untie_r else self.position_bias
            hidden = block(hidden, memory[STATES][:, i], position, mask, u, v, training=training)
        hidden = self.output_dropout(hidden, training=training)
        return hidden, updated_memory(memory, layer_inputs, segment_valid)

    def compute_output_spec(self, token_ids, memory=None, reset=None, training=None,
                            clamp_len=None, same_length=None, segment_valid=None):
        c = self.config
        batch, segment_len = token_ids.shape[0], token_ids.shape[1]
        mem_len = c.mem_len if memory is None else memory[STATES].shape[2]
        dtype = self.compute_dtype
        hidden = keras.KerasTensor((batch, segment_len, c.d_model), dtype=dtype)
        states_dtype = dtype if memory is None else memory[STATES].dtype
        return hidden, {
            STATES: keras.KerasTensor((batch, c.n_layer, mem_len, c.d_model), dtype=states_dtype),
            VALID: keras.KerasTensor((batch, mem_len), dtype="bool"),
        }

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}
