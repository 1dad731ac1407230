"""The Transformer-XL backbone: token ids + memory -> hidden states + new memory.

Shape glossary: B batch (streams), T segment length, L layers, M memory length, K = M + T,
D model size, N heads, H head size. Public tensors are batch-major.
"""

import keras
from keras import ops

from tfxl.config import TransfoXLConfig
from tfxl.layers.adaptive_embedding import AdaptiveEmbedding
from tfxl.layers.dropout import HashDropout
from tfxl.layers.memory import KeyValueMemory, KeyValueRing, LayerInputMemory, as_memory
from tfxl.layers.relative_position import RelativePositionEncoding
from tfxl.layers.transformer_xl_block import TransformerXLBlock, attention_class


def as_config(config):
    return config if isinstance(config, TransfoXLConfig) else TransfoXLConfig.from_dict(config)


def default_name(name):
    """Keras' unique default name (`name`, then `name_1`, ...; the counter Keras' own default
    names use) for a class whose snake-cased name reads wrong (TransfoXLLM -> transfo_xllm)."""
    uid = keras.backend.get_uid(name)
    return name if uid == 1 else f"{name}_{uid - 1}"


def init_memory(config, batch_size, mem_len=None, dtype="float32"):
    """An empty layer-input memory for `config`: `batch_size` rows, `mem_len` slots (default
    config.mem_len)."""
    mem_len = config.mem_len if mem_len is None else mem_len
    return LayerInputMemory.empty(batch_size, config.n_layer, mem_len, config.d_model, dtype)


def init_key_value_memory(config, batch_size, mem_len=None, dtype="float32"):
    """An empty key/value memory for `config` (default mem_len: config.eval_settings())."""
    mem_len = config.eval_settings(mem_len=mem_len)["mem_len"]
    return KeyValueMemory.empty(batch_size, config.n_layer, mem_len, config.n_head,
                                config.d_head, dtype)


def init_key_value_ring(config, batch_size, tgt_len=None, mem_len=None, dtype="float32"):
    """An empty `KeyValueRing` for segments of `tgt_len` tokens (defaults:
    config.eval_settings())."""
    s = config.eval_settings(tgt_len=tgt_len, mem_len=mem_len)
    return KeyValueRing.empty(batch_size, config.n_layer, s["mem_len"], s["tgt_len"],
                              config.n_head, config.d_head, dtype)


@keras.saving.register_keras_serializable(package="tfxl")
class TransfoXLBackbone(keras.layers.Layer):
    """Stateless Transformer-XL: memory goes in and comes out as tensors.

    Call args:
      token_ids: int [B, T].
      memory: a `LayerInputMemory` (training), a `KeyValueMemory` (inference: only the T new
        rows are projected), a `KeyValueRing` (the same, written in place, for loops of
        equal segments), see `tfxl.layers.memory`; or None for an empty layer-input memory
        of `config.mem_len` slots. M is taken from the memory given, so evaluation may use a
        longer memory than training. The new memory is of the same type.
      reset: optional bool [B]: rows whose memory is cleared before this segment (a new document).
      segment_valid: optional bool [B, T]: False marks padding tokens (e.g. left-padded prompts of
        different lengths), which no query attends to and the memory does not keep.
      training: enables dropout.
      clamp_len, same_length: override the config for this call (evaluation uses the paper's
        longer settings with the same weights).
      position_keys: `position_keys(M + T, clamp_len)` computed once and reused by every call of
        that shape (inference; without it each call projects the K encodings in every layer).
      memory_gradient: keep the gradient path through the new memory (default False:
        the paper's stop-gradient). Document classification reads its last segments with it, so
        that the loss reaches them through the memory (`tfxl.classification`).
    Returns:
      (hidden [B, T, D], new memory of the same shapes as the one used); with
      `return_memory=False` (a constructor argument) only hidden, so that the backbone can be
      one layer of a `keras.Sequential`.
    """

    def __init__(self, config, attention_cls=None, return_memory=True, **kwargs):
        super().__init__(**kwargs)
        self.config = as_config(config)
        if self.config.architecture != "transformer_xl":
            raise ValueError(f"a Transformer-XL model needs config.architecture "
                             f"'transformer_xl', got {self.config.architecture!r} (build a "
                             "baseline with tfxl.models.build_language_model)")
        self.attention_cls = attention_class(attention_cls)
        self.return_memory = bool(return_memory)

    def build(self, ids_shape=None):
        c = self.config
        policy = self.dtype_policy
        self.embedding = AdaptiveEmbedding(
            c.vocab_size, c.embed_dim, c.d_model, c.cutoffs, c.div_val, c.proj_same_dim,
            c.init_std, c.proj_init_std, name="embedding", dtype=policy)
        self.embedding.build(ids_shape)
        self.position_encoding = RelativePositionEncoding(c.d_model, c.clamp_len,
                                                          name="position_encoding", dtype=policy)
        self.embedding_dropout = HashDropout(c.dropout, name="embedding_dropout", dtype=policy)
        self.position_dropout = HashDropout(c.dropout, name="position_dropout", dtype=policy)
        self.output_dropout = HashDropout(c.dropout, name="output_dropout", dtype=policy)
        hidden_shape = (None, None, c.d_model)
        for i in range(c.n_layer):
            block = TransformerXLBlock(
                c.d_model, c.n_head, c.d_head, c.d_inner, c.dropout, c.dropatt, c.pre_lnorm,
                c.init_std, c.layer_norm_epsilon, attention_cls=self.attention_cls,
                name=f"block_{i}", dtype=policy)
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
        """An empty layer-input memory (default mem_len: config.mem_len), for training."""
        return init_memory(self.config, batch_size, mem_len, dtype or self.compute_dtype)

    def init_key_value_memory(self, batch_size, mem_len=None, dtype=None):
        """An empty key/value memory (default mem_len: the config's eval_mem_len), for inference."""
        return init_key_value_memory(self.config, batch_size, mem_len, dtype or self.compute_dtype)

    def init_key_value_ring(self, batch_size, tgt_len=None, mem_len=None, dtype=None):
        """An empty key/value ring for segments of `tgt_len` tokens (defaults: the config's
        eval settings), for loops of equal segments."""
        return init_key_value_ring(self.config, batch_size, tgt_len, mem_len,
                                   dtype or self.compute_dtype)

    def key_value_memory(self, memory):
        """The key/value memory a layer-input memory stands for under the current weights.

        Carries a trainer's or a client's memory over to the inference path exactly: the keys and
        values are what every later segment would have projected from those layer inputs.
        """
        memory = as_memory(memory, "key_value_memory", dicts=False)
        if isinstance(memory, KeyValueMemory):
            return memory
        pairs = [block.attention.project_memory(memory.states[:, i])
                 for i, block in enumerate(self.blocks)]
        return KeyValueMemory(tuple(k for k, _ in pairs), tuple(v for _, v in pairs),
                              memory.valid)

    def position_keys(self, key_length, clamp_len=None):
        """Every layer's position keys for K = `key_length` (a Python int): a list of L tensors
        [N, H, K + 1] to pass as `position_keys=` to every inference call of that shape."""
        position = self.position_encoding(key_length=key_length, clamp_len=clamp_len)
        return [block.attention.project_positions(position) for block in self.blocks]

    def call(self, token_ids, memory=None, reset=None, training=None, clamp_len=None,
             same_length=None, segment_valid=None, position_keys=None, memory_gradient=False):
        c = self.config
        same_length = c.same_length if same_length is None else bool(same_length)
        segment_len = token_ids.shape[1] if token_ids.shape[1] is not None else (
            ops.shape(token_ids)[1])
        if memory is None:
            memory = self.init_memory(ops.shape(token_ids)[0])
        memory = as_memory(memory, self.name, dicts=False).reset(reset).with_invalid_slots_zeroed()
        mask = memory.attention_mask(segment_len, same_length, segment_valid)
        key_length = memory.key_length(segment_len)
        if position_keys is not None and position_keys[0].shape[-1] not in (None,
                                                                            key_length + 1):
            raise ValueError(f"position_keys were computed for {position_keys[0].shape[-1] - 1} "
                             f"keys; this call has M + T = {memory.mem_len} + {segment_len}")
        if position_keys is None:
            position = self.position_encoding(key_length=key_length, clamp_len=clamp_len)
            position = self.position_dropout(position, training=training)
            position_keys = [b.attention.project_positions(position) for b in self.blocks]
        hidden = self.embedding_dropout(self.embedding(token_ids), training=training)
        hidden, kept = self.run_blocks(hidden, memory, position_keys, mask, training)
        hidden = self.output_dropout(hidden, training=training)
        if not self.return_memory:
            return hidden
        return hidden, memory.updated(kept, segment_len, segment_valid,
                                      stop_gradient=not memory_gradient)

    def run_blocks(self, hidden, memory, position_keys, mask, training=None):
        """Every block in turn on embedded `hidden` [B, T, D], each attending to its layer of
        `memory` under the caller's attention `mask`; returns (hidden, what the memory keeps of
        each layer: `memory.updated`'s argument, as each layer's view says). `call` builds the
        mask from the memory; tfxl.hub's cache passes its own per-row mask."""
        c = self.config
        kept = []
        for i, block in enumerate(self.blocks):
            view = memory.layer(i)
            u = self.content_bias[i] if c.untie_r else self.content_bias
            v = self.position_bias[i] if c.untie_r else self.position_bias
            output, written = block(hidden, view, position_keys[i], mask, u, v, training=training)
            kept.append(view.kept(hidden, written))
            hidden = output
        return hidden, kept

    def compute_output_shape(self, ids_shape, memory_shape=None):
        """hidden [B, T, D] and, with return_memory, the memory's shapes (a memory type of
        shape tuples): the layer-input memory of config.mem_len slots unless `memory_shape`
        says otherwise."""
        c = self.config
        batch, segment_len = ids_shape[0], ids_shape[1]
        hidden = (batch, segment_len, c.d_model)
        if not self.return_memory:
            return hidden
        if memory_shape is None:
            memory_shape = LayerInputMemory((batch, c.n_layer, c.mem_len, c.d_model),
                                            (batch, c.mem_len))
        return hidden, keras.tree.map_shape_structure(
            lambda shape: (batch,) + tuple(shape[1:]), memory_shape)

    def compute_output_spec(self, token_ids, memory=None, reset=None, training=None,
                            clamp_len=None, same_length=None, segment_valid=None,
                            position_keys=None, memory_gradient=False):
        c = self.config
        if memory is None:
            memory = LayerInputMemory(
                keras.KerasTensor((None, c.n_layer, c.mem_len, c.d_model), self.compute_dtype),
                keras.KerasTensor((None, c.mem_len), "bool"))
        memory = as_memory(memory, self.name, dicts=False)
        hidden = keras.KerasTensor((token_ids.shape[0], token_ids.shape[1], c.d_model),
                                   self.compute_dtype)
        if not self.return_memory:
            return hidden
        batch = token_ids.shape[0]
        return hidden, keras.tree.map_structure(
            lambda t: keras.KerasTensor((batch,) + tuple(t.shape[1:]), t.dtype), memory)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "attention_cls": keras.saving.get_registered_name(self.attention_cls),
                "return_memory": self.return_memory}
