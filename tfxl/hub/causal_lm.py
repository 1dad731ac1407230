"""`TransfoXLCausalLM`: keras-hub's CausalLM (generate, samplers, presets) for Transformer-XL.

Shape glossary: B batch, S sequence length (prompt + generated, keras-hub's max_length), L layers,
N heads, H head size, M memory length, V vocabulary size.

Generation semantics are tfxl's own (`tfxl.models.generation`), token for token under greedy
sampling: the prompt is read as one segment on an empty memory of M slots (every prompt token
sees the whole prompt before it, or only the last M positions with same_length), and every
generated token sees the last M positions before it and itself. M, clamp_len and same_length
are the config's evaluation settings (`mem_len=` overrides M).

The cache is keras-hub's kind: fixed shapes, indexed by the position being written, batch first
so that the beam sampler can repeat and reorder it: a dict of keys and values over all S
positions ("keys" L x [B, N, H, S], "values" L x [B, N, S, H]) plus each row's prompt length
("prompt_length" [B]). A step reads it as a `tfxl.layers.memory.PositionCache`: the token at t
is written at slot t (in place under XLA) and sees slots t - M..t through the attention mask, at
relative distances t - j, so no slot ever moves.
"""


import keras
from keras import ops
from keras_hub.models import CausalLM
from keras_hub.samplers import ContrastiveSampler
from keras_hub.samplers import get as get_sampler

from tfxl import backend
from tfxl.hub.backbone import TransfoXLHubBackbone
from tfxl.hub.preprocessor import TransfoXLCausalLMPreprocessor
from tfxl.hub.presets import save_preset
from tfxl.layers.memory import KEYS, VALUES, KeyValueMemory, PositionCache

PROMPT_LENGTH = "prompt_length"


def is_any_of(token_ids, values, where):
    """True where `token_ids` holds one of `values` and `where` is True (bool, token_ids' shape)."""
    found = ops.zeros_like(token_ids, dtype="bool")
    for value in values:
        found = ops.logical_or(found, ops.equal(token_ids, value))
    return ops.logical_and(found, where)


@keras.saving.register_keras_serializable(package="tfxl")
class TransfoXLCausalLM(CausalLM):
    """Transformer-XL language model as a keras-hub `CausalLM`.

    Calling it (fit, predict, evaluate) gives log-probabilities [B, S, V] (keras-hub's "logits":
    its losses and samplers apply a softmax, which leaves log-probabilities unchanged) of one
    segment on an empty memory, with the config's training settings. `generate()` runs keras-hub's
    samplers (greedy, top-k, top-p, beam, ...) on the key/value cache described in the module
    docstring.

    Args:
      backbone: a `TransfoXLHubBackbone`.
      preprocessor: a `TransfoXLCausalLMPreprocessor` or None (then `generate` takes
        {"token_ids", "padding_mask"} padded to max_length).
      mem_len: the memory length M of generation (default: the config's eval_mem_len, as
        `TransfoXLLM.generate`).

    Examples:

    ```python
    import tfxl
    from tfxl.data.tokenizers import BytesTokenizer
    from tfxl.hub import causal_lm_from_model

    model = tfxl.TransfoXLLM(tfxl.get_preset("tiny", vocab_size=258))
    causal_lm = causal_lm_from_model(model, BytesTokenizer(), sequence_length=32)
    causal_lm.compile(sampler="greedy")
    text = causal_lm.generate("def main(", max_length=16)
    ```
    """

    backbone_cls = TransfoXLHubBackbone
    preprocessor_cls = TransfoXLCausalLMPreprocessor

    def __init__(self, backbone, preprocessor=None, mem_len=None, **kwargs):
        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        # === Functional model ===
        inputs = backbone.input
        log_probs, _ = backbone.language_model(
            inputs["token_ids"], segment_valid=ops.cast(inputs["padding_mask"], "bool"))
        super().__init__(inputs=inputs, outputs=log_probs, **kwargs)
        # === Config ===
        self.mem_len = None if mem_len is None else int(mem_len)
        if self.mem_len is not None and self.mem_len < 0:
            raise ValueError(f"mem_len must be >= 0, got {mem_len}")

    def compile(self, *args, sampler="top_k", **kwargs):
        """keras-hub's `compile`; every keras-hub sampler but the contrastive one, which needs
        each step's hidden states (the cache keeps only keys and values): refused here, with the
        model's earlier compilation kept."""
        sampler = get_sampler(sampler)
        if isinstance(sampler, ContrastiveSampler):
            raise ValueError("TransfoXLCausalLM: the contrastive sampler is not supported (it "
                             "needs hidden states, which the key/value cache does not keep); use "
                             "greedy, top_k, top_p, random or beam")
        super().compile(*args, sampler=sampler, **kwargs)

    def make_generate_function(self):
        """keras-hub's, with the backend's own generate function where it has one (TensorFlow:
        each compile's tf.function counts its own traces, `tfxl.backend.tensorflow`)."""
        if self.generate_function is None and not self.run_eagerly:
            self.generate_function = backend.current().hub_generate_function(self)
        return super().make_generate_function()

    def _settings(self):
        return self.backbone.config.eval_settings(mem_len=self.mem_len)

    def _position_keys(self, sequence_length):
        """Every layer's position keys for the S distances 0..S-1 (computed once per generate)."""
        if sequence_length is None:
            raise ValueError("generation needs token_ids of a static length (keras-hub's "
                             "max_length)")
        return self.backbone.language_model.position_keys(
            sequence_length, self._settings()["clamp_len"])

    def _sees(self, query_position, key_position, prompt_length):
        """Which keys a query may attend to: bool, broadcast of the three int arguments.

        Key j before query t is seen when t - j <= M, or anywhere in the prompt when t is a
        prompt position and same_length is off (tfxl reads the prompt as one segment).
        """
        settings = self._settings()
        distance = query_position - key_position
        window = distance <= settings["mem_len"]
        if not settings["same_length"]:
            window = window | (query_position < prompt_length)
        return (distance >= 0) & window

    def call_with_cache(self, token_ids, cache, cache_update_index, position_keys=None):
        """One token per row at position t = `cache_update_index` against the cache.

        Args:
          token_ids: int [B, 1], the tokens at position t.
          cache: {"keys", "values", "prompt_length"} as `_build_cache` builds it.
          cache_update_index: int scalar t.
          position_keys: `_position_keys(S)`, to reuse across steps.
        Returns:
          (log_probs [B, 1, V], hidden states: None, the cache with slot t written).
        """
        keys, values = cache[KEYS], cache[VALUES]
        sequence_length = keys[0].shape[-1]
        if position_keys is None:
            position_keys = self._position_keys(sequence_length)
        t = ops.cast(cache_update_index, "int32")
        slots = ops.arange(sequence_length, dtype="int32")
        # Slot t is the token itself; slots after it are not written yet.
        mask = self._sees(t, slots[None, :], cache[PROMPT_LENGTH][:, None]) & (slots <= t)
        lm = self.backbone.language_model
        hidden, written = lm.backbone.run_blocks(
            lm.backbone.embedding(token_ids), PositionCache(tuple(keys), tuple(values), t),
            position_keys, mask[:, None, None, :], training=False)
        return lm.head(hidden), None, {**cache, KEYS: [k for k, _ in written],
                                       VALUES: [v for _, v in written]}

    def _build_cache(self, token_ids, padding_mask, position_keys=None):
        """The cache after reading all S positions in one pass (the prefill).

        Prompt positions get the keys and values tfxl's prompt segment gives them; the slots
        after a row's prompt get its padding's, which `call_with_cache` overwrites before any
        later token reads them.
        """
        lm = self.backbone.language_model
        backbone = lm.backbone
        sequence_length = token_ids.shape[1]
        if position_keys is None:
            position_keys = self._position_keys(sequence_length)
        prompt_length = ops.sum(ops.cast(padding_mask, "int32"), axis=-1)
        positions = ops.arange(sequence_length, dtype="int32")
        mask = self._sees(positions[None, :, None], positions[None, None, :],
                          prompt_length[:, None, None])[:, None]  # [B, 1, S, S]
        config = lm.config
        no_memory = KeyValueMemory.empty(ops.shape(token_ids)[0], config.n_layer, 0,
                                         config.n_head, config.d_head, backbone.compute_dtype)
        # The backbone's own call builds its mask from a memory; the prefill needs per-row prompt
        # lengths, so it runs the backbone's block loop with the mask above.
        _, written = backbone.run_blocks(backbone.embedding(token_ids), no_memory,
                                         position_keys, mask, training=False)
        return {KEYS: [k for k, _ in written], VALUES: [v for _, v in written],
                PROMPT_LENGTH: prompt_length}

    def generate_step(self, inputs, stop_token_ids=None):
        """One batch of generation, XLA-compilable (keras-hub's `generate` compiles it).

        inputs: {"token_ids": int [B, S], "padding_mask": [B, S]} with each prompt left-aligned.
        Returns the same dict with the generated tokens written after each prompt and the
        padding mask marking what is kept (up to and including a stop token).
        """
        token_ids, padding_mask = inputs["token_ids"], inputs["padding_mask"]
        position_keys = self._position_keys(token_ids.shape[1])
        cache = self._build_cache(token_ids, padding_mask, position_keys)
        # Start at the first index that has no prompt token in some row.
        index = ops.min(cache[PROMPT_LENGTH])

        # `next` (shadowing the builtin) is the name keras-hub's samplers call it by.
        def next(prompt, cache, index):
            # The token before `index` is read; its log-probabilities choose the token at index.
            t = index - 1
            token = ops.slice(prompt, [0, t], [ops.shape(prompt)[0], 1])
            log_probs, _, cache = self.call_with_cache(token, cache, t, position_keys)
            return ops.squeeze(log_probs, axis=1), None, cache

        token_ids = self.sampler(next=next, prompt=token_ids, cache=cache, index=index,
                                 mask=padding_mask, stop_token_ids=stop_token_ids,
                                 hidden_states=None, model=self)
        if stop_token_ids is not None:
            # Keep everything up to and including the first stop token after the prompt.
            end_locations = ops.cast(
                is_any_of(token_ids, stop_token_ids, ops.logical_not(padding_mask)), "int32")
            overflow = ops.cumsum(end_locations, axis=-1) - end_locations
            padding_mask = ops.logical_not(ops.cast(overflow, "bool"))
        else:
            padding_mask = ops.ones_like(token_ids, dtype="bool")
        return {"token_ids": token_ids, "padding_mask": padding_mask}

    def save_to_preset(self, preset_dir, max_shard_size=10):
        """keras-hub's `save_to_preset`, into a local directory or a bucket
        (`tfxl.hub.presets`)."""
        save_preset(super().save_to_preset, preset_dir, max_shard_size=max_shard_size)

    def get_config(self):
        return {**super().get_config(), "mem_len": self.mem_len}
