"""Transformer-XL language model: the backbone plus an adaptive softmax.

Shape glossary: B batch, T segment length, V vocabulary size, L layers, M memory length, D model
size.
"""

import keras
import numpy as np

from tfxl.config import TransfoXLConfig
from tfxl.layers.adaptive_softmax import AdaptiveSoftmax
from tfxl.layers.transformer_xl_block import attention_class
from tfxl.models import generation
from tfxl.models.sampling import check_sampling
from tfxl.models.backbone import (TransfoXLBackbone, as_config, default_name,
                                  init_key_value_memory, init_key_value_ring,
                                  init_memory)


@keras.saving.register_keras_serializable(package="tfxl")
class TransfoXLLM(keras.Model):
    """Stateless language model.

    Call args:
      token_ids: int [B, T].
      memory: a layer-input memory (training) or a key/value memory (inference), see
        `tfxl.layers.memory`, or None for an empty layer-input memory. The new memory returned
        is of the same kind.
      reset: optional bool [B], rows whose memory is cleared before this segment.
      targets: optional int [B, T].
      training: enables dropout.
      clamp_len, same_length: per-call overrides of the config (e.g. the paper's eval settings).
      segment_valid: optional bool [B, T], False at padding tokens (see the backbone).
      position_keys: `position_keys(M + T)` reused across inference calls (see the backbone).
    Returns:
      (nll [B, T] float32, new memory) when `targets` is given — no [B, T, V] tensor is built;
      otherwise (log_probs [B, T, V] float32, new memory).

    Built on construction (no weight's shape depends on the input): its weights, `summary()`
    and methods such as `init_key_value_memory` or `position_keys` work before any call.

    Examples:

    ```python
    import numpy as np
    import tfxl

    model = tfxl.TransfoXLLM(tfxl.get_preset("tiny", vocab_size=258))
    tokens = np.random.default_rng(0).integers(0, 258, size=(2, 65))
    memory = model.init_memory(batch_size=2)
    nll, memory = model(tokens[:, :64], memory, targets=tokens[:, 1:])   # [2, 64]
    log_probs, memory = model(tokens[:, :8], memory)                      # [2, 8, 258]
    new_tokens = model.generate(tokens[:, :4], max_new_tokens=8, seed=1)  # numpy [2, 8]
    ```
    """

    architecture = "transformer_xl"  # config.architecture (tfxl.models.language_model_class)

    def __init__(self, config, attention_cls=None, name=None, **kwargs):
        super().__init__(name=name or default_name("transfo_xl_lm"), **kwargs)
        self.config = as_config(config)
        self.attention_cls = attention_class(attention_cls)
        self.build((None, None))  # any batch, any segment length

    def build(self, ids_shape=None):
        if self.built:  # built by __init__; Keras and callers may ask again
            return
        c = self.config
        self.backbone = TransfoXLBackbone(c, attention_cls=self.attention_cls, name="backbone",
                                          dtype=self.dtype_policy)
        self.backbone.build(ids_shape)
        self.softmax = AdaptiveSoftmax(
            c.vocab_size, c.embed_dim, c.d_model, c.cutoffs, c.div_val, c.proj_same_dim,
            c.tie_weight, c.cluster_tie_projs, c.init_std, c.proj_init_std, name="softmax",
            dtype=self.dtype_policy)
        self.softmax.build((None, None, c.d_model))

    @classmethod
    def get_layout_map(cls, config, device_mesh, *, model_dim="model"):
        """The `keras.distribution.LayoutMap` that splits the model's large weights over the
        `model_dim` axis of `device_mesh`, for `keras.distribution.ModelParallel` (JAX).

        Split: the attention projections by head (W_q, W_k,E, W_v, W_k,R [D, N, H]; W_o
        [N, H, D]), the feed-forward's inner dimension (Megatron's column- then row-split
        pair), and each adaptive embedding and softmax table along its features [n_i, d_i]
        (vocabularies such as WikiText-103's 267,735 words rarely divide the axis; the feature
        widths, powers of two, do). An axis the mesh does not divide stays whole, as does
        everything else (layer norms, biases, the r biases, projections): with XLA's
        partitioner every layout computes the same values.

        Examples:

        ```python
        import keras
        import tfxl

        config = tfxl.get_preset("tiny", vocab_size=258)
        mesh = keras.distribution.DeviceMesh((1, 1), ("batch", "model"),
                                             keras.distribution.list_devices()[:1])
        layout_map = tfxl.TransfoXLLM.get_layout_map(config, mesh)
        distribution = keras.distribution.ModelParallel(layout_map=layout_map,
                                                        batch_dim_name="batch")
        ```
        """
        from tfxl.layers.adaptive_clusters import cluster_layout
        c = as_config(config)
        size = dict(zip(device_mesh.axis_names, device_mesh.shape))[model_dim]

        def split(rank, axis, length):
            spec = [None] * rank
            if length % size == 0:
                spec[axis] = model_dim
            return tuple(spec)

        layout_map = keras.distribution.LayoutMap(device_mesh)
        # Keras matches a variable's whole path (re.fullmatch).
        layout_map[r".*/attention/(query|key|value|position)_kernel"] = split(3, 1, c.n_head)
        layout_map[r".*/attention/output_kernel"] = split(3, 0, c.n_head)
        layout_map[r".*/feed_forward/inner/kernel"] = split(2, 1, c.d_inner)
        layout_map[r".*/feed_forward/inner/bias"] = split(1, 0, c.d_inner)
        layout_map[r".*/feed_forward/outer/kernel"] = split(2, 0, c.d_inner)
        clusters = cluster_layout(c.vocab_size, c.cutoffs, c.embed_dim, c.d_model, c.div_val,
                                  c.proj_same_dim)
        for i, cluster in enumerate(clusters):
            layout_map[rf".*/(embedding/table|softmax/weight)_{i}"] = split(2, 1, cluster.dim)
        return layout_map

    def compute_output_shape(self, ids_shape):
        """log_probs [B, T, V] and the layer-input memory's shapes (the call without targets
        or memory)."""
        hidden_shape, memory_shape = self.backbone.compute_output_shape(ids_shape)
        return hidden_shape[:2] + (self.config.vocab_size,), memory_shape

    def init_memory(self, batch_size, mem_len=None, dtype=None):
        """An empty layer-input memory (default mem_len: config.mem_len), for training."""
        return init_memory(self.config, batch_size, mem_len, dtype or self.compute_dtype)

    def init_key_value_memory(self, batch_size, mem_len=None, dtype=None):
        """An empty key/value memory (default mem_len: the config's eval_mem_len), for inference."""
        return init_key_value_memory(self.config, batch_size, mem_len, dtype or self.compute_dtype)

    def init_key_value_ring(self, batch_size, tgt_len=None, mem_len=None, dtype=None):
        """See `TransfoXLBackbone.init_key_value_ring`."""
        return init_key_value_ring(self.config, batch_size, tgt_len, mem_len,
                                   dtype or self.compute_dtype)

    def key_value_memory(self, memory):
        """See `TransfoXLBackbone.key_value_memory`."""
        return self.backbone.key_value_memory(memory)

    def position_keys(self, key_length, clamp_len=None):
        """See `TransfoXLBackbone.position_keys`."""
        return self.backbone.position_keys(key_length, clamp_len)

    def generate(self, prompt_ids, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, seed=0,
                 mem_len=None):
        """Samples `max_new_tokens` tokens after each prompt, on a key/value memory.

        prompt_ids: int [B, P] (or [P] for one prompt). temperature 0 is greedy; top_k 0 and
        top_p 1 switch those filters off; the same seed gives the same tokens. The memory length
        (default the config's eval_mem_len), clamp_len and same_length are the config's evaluation
        settings; the prompt is read in segments of the evaluation tgt_len
        (`generation.read_prompt`), so its length costs no memory. Runs as one compiled loop per
        memory length, traced on first use
        (`generation.compiled_generate`: on TensorFlow one trace for every prompt shape and
        length, on JAX one compile per shape and max_new_tokens, on PyTorch eager). Returns the
        new tokens as a numpy int32 array [B, max_new_tokens] (or [max_new_tokens]). Raises
        ValueError (InvalidArgumentError on TensorFlow) where the log-probabilities are not
        finite, so that no token can be drawn, and ValueError naming `mem_len` or
        `max_new_tokens` where the memory or the tokens' buffer would exceed 2 GiB
        (`generation.check_generation_sizes`).
        """
        ids = np.asarray(prompt_ids, np.int32)
        if ids.ndim not in (1, 2) or ids.shape[-1] == 0:
            raise ValueError(f"prompt_ids must be [P] or [B, P] with P >= 1, got shape {ids.shape}")
        # The rules tfxl-generate and the exported signatures check, before the compiled loop
        # (inside it nothing refuses a bad value or id: see AdaptiveEmbedding).
        check_sampling(max_new_tokens, temperature, top_k, top_p)
        low, high = generation.INT32_SEEDS
        if not low <= int(seed) <= high:  # the int32 the exported signatures take
            raise ValueError(f"seed must be an int32, {low}..{high}, got {seed}")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            bad = ids.min() if ids.min() < 0 else ids.max()
            raise ValueError(f"prompt_ids: token id {bad} is outside the vocabulary "
                             f"[0, {self.config.vocab_size})")
        settings = self.config.eval_settings(mem_len=mem_len)
        mem_len = settings["mem_len"]
        # Before anything is built: a size no machine holds is a ValueError naming it.
        generation.check_generation_sizes(self.config, int(np.prod(ids.shape[:-1])), mem_len,
                                          settings["tgt_len"], int(max_new_tokens))
        if not hasattr(self, "_generate_loops"):
            # Set past Keras/TensorFlow tracking: a tracked dict of tf.functions keyed by ints
            # would make every later SavedModel export of this model fail.
            object.__setattr__(self, "_generate_loops", {})
        if mem_len not in self._generate_loops:
            self._generate_loops[mem_len] = generation.compiled_generate(
                self, mem_len, settings["clamp_len"], settings["same_length"])
        # numpy scalars of the loop's dtypes: TensorFlow's signature and JAX's jit take them as
        # they are (a Python float would be a weakly typed JAX value).
        out = keras.ops.convert_to_numpy(self._generate_loops[mem_len](
            ids.reshape(-1, ids.shape[-1]), int(max_new_tokens), np.float32(temperature),
            np.int32(top_k), np.float32(top_p), np.int32(seed)))
        if (out == generation.NO_TOKEN).any():  # only where nothing could raise (generate)
            raise ValueError(generation.NOT_FINITE)
        return out[0] if ids.ndim == 1 else out

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None,
               **kwargs):
        """A SavedModel at `filepath` with `tfxl-export`'s signatures (`keras.Model.export`'s
        default would trace `call`, whose (tensor, memory) output no signature can return).

        score (= serving_default), init_memory, generate, score_document and
        score_document_masked; with `tokenizer=` (a `tfxl.data.tokenizers` tokenizer) also
        generate_text, score_text, encode_text and decode_ids. See `tfxl.models.signatures` for
        their inputs and outputs. Other keyword arguments: tgt_len, mem_len, clamp_len,
        same_length (default: the config's evaluation settings) and score_top_k (default 16;
        0: full log-probs). Unlike Keras, an existing file or non-empty directory at `filepath`
        is never overwritten. Only format="tf_saved_model"; the signatures fix their own inputs,
        so input_signature must be None.
        """
        if format != "tf_saved_model":
            raise ValueError(f"TransfoXLLM.export: format={format!r} is not supported; only "
                             "'tf_saved_model' (the serving signatures need TensorFlow ops)")
        if input_signature is not None:
            raise ValueError("TransfoXLLM.export: input_signature must be None; every signature "
                             "fixes its own inputs (see tfxl.models.signatures)")
        # Imported here: the export is TensorFlow code (tf.function, tf.saved_model), and the
        # model runs on every Keras backend.
        from tfxl.models.signatures import export_model
        export_model(self, filepath, verbose, **kwargs)

    def head(self, hidden, targets=None):
        """The adaptive softmax on the backbone's hidden states [B, T, D], its weights tied to
        the embedding's as the config says: nll [B, T] float32 of `targets` [B, T] when given
        (no [B, T, V] tensor is built), else log_probs [B, T, V] float32."""
        embedding = self.backbone.embedding
        n = len(embedding.clusters)
        weights = ([embedding.cluster_weight(i) for i in range(n)] if self.config.tie_weight
                   else None)
        projections = [embedding.cluster_projection(i) for i in range(n)]
        return self.softmax(hidden, targets, tied_weights=weights, tied_projections=projections)

    def call(self, token_ids, memory=None, reset=None, targets=None, training=None,
             clamp_len=None, same_length=None, segment_valid=None, position_keys=None):
        hidden, new_memory = self.backbone(token_ids, memory, reset, training=training,
                                           clamp_len=clamp_len, same_length=same_length,
                                           segment_valid=segment_valid,
                                           position_keys=position_keys)
        return self.head(hidden, targets), new_memory

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "attention_cls": keras.saving.get_registered_name(self.attention_cls)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        model_config = TransfoXLConfig.from_dict(config.pop("config"))
        return cls(model_config, **config)
