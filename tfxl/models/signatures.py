"""A language model's SavedModel export for TF Serving (`tf.saved_model.save`), stateless: every
request is complete. TensorFlow code, where the model runs on every Keras backend: `tfxl.models`
imports it only when `TransfoXLLM.export` is called; `tfxl-export` (`tfxl.serving.export_main`)
calls `export_saved_model`.

Shape glossary: B batch, T segment length, S document length (tokens), P prompt length, G new
tokens, L layers, N heads, M memory length, H head size, V vocabulary size, K score_top_k.
L, N, H and V are the model's; M and the other evaluation settings are fixed at export.

Signatures (batch-major; concurrent requests never share state). The memory on the wire is the
key/value memory of `tfxl.layers.memory`: keys float32 [B, L, N, H, M], values float32
[B, L, N, M, H], valid bool [B, M].
  score (= serving_default): token_ids int32 [B, T], keys, values, valid
      -> log_probs float32 [B, T, V] (score_top_k=0) or top_ids int32 [B, T, K] and
         top_log_probs float32 [B, T, K]; plus the new keys, values, valid. The client carries
         the memory from request to request (streaming).
  init_memory: batch_size int32 [] -> keys, values, valid (no valid slot).
  generate: prompt_ids int32 [B, P], keys, values, valid, max_new_tokens int32 [],
      temperature float32 [], top_k int32 [], top_p float32 [], seed int32 []
      -> generated_ids int32 [B, G], keys, values, valid. The prompt is read in segments of T
      on the memory (`tfxl.models.generation.read_prompt`, as score_document reads a document:
      any P costs one segment's attention), then one tf.while_loop step per new token.
      The memory returned holds everything but the last generated token: continue by sending
      generated_ids[:, -1:] as the next prompt.
  score_document: token_ids int32 [B, S], S >= 2
      -> nll float32 [B, S - 1] (nll[:, t] = -log p(token t+1 | tokens <= t)), mean_nll
         float32 [] (mean over every counted token of the batch), tokens int32 [B] (counted per
         row). The whole document in one request: segments of T = the export's tgt_len in an
         in-graph loop over the memory (`tfxl.models.scoring`); no memory on the wire.
  score_document_masked: token_ids int32 [B, S], target_mask float32 [B, S - 1] (1 = count,
      0 = don't, e.g. the right padding of shorter rows) -> the same, nll 0 where not counted.
With a tokenizer:
  generate_text: prompt string [B], max_new_tokens, temperature, top_k, top_p, seed
      -> text string [B] (the continuation). Prompts are left-padded and the padding masked,
      and read in segments of T as generate reads them.
  score_text: text string [B] -> nll float32 [B, S - 1] (0 after a row's last token), tokens
      int32 [B], and bpc float32 [B] (character-level tokenizers) or perplexity float32 [B].
      A text is framed as tfxl-prepare frames a document: <eod>, then the tokenizer's ids of the
      text as they are (bytes: its UTF-8 bytes; line tokenizers: <eos> for each newline, none
      added at the end). <eod> is context only, so every token of the text is scored once, the
      first given <eod> alone, and tokens = the text's token count. bpc = the row's summed NLL /
      tokens / ln 2 (bits per byte for `bytes`, per character for `chars`: what tfxl-eval reports),
      perplexity = exp(summed NLL / tokens).
  encode_text: text string [] -> ids int32 [P];  decode_ids: ids int32 [G] -> text string []:
      the tokenizer itself, so that `tfxl-generate --model=EXPORT` needs no data directory. The
      export also records the tokenizer's vocabulary hash in assets.extra/tfxl_data.json.
Bad requests (wrong rank or shape, memory of another export, batch mismatch, ids outside [0, V),
empty inputs, sampling values out of range, NaN or infinity in a memory, a batch over
`max_batch_size`) fail at the signature's entry with one InvalidArgumentError naming the input,
the expected and the received shape or value (`tfxl.saved_model.request_checks`): TF Serving
feeds tensors into the graph unchecked. The batch bound: a signature that builds a memory from a
few bytes (init_memory, generate_text, score_text, score_document*) would otherwise allocate B
rows of it for a one-line request; max_batch_size is the largest B whose memory (keys, values,
valid) fits in MAX_MEMORY_BYTES = 2 GiB (`tfxl.saved_model.signature_set`), the most a protobuf
response can carry back anyway. Likewise generate and generate_text refuse B x P, P rounded up
to whole segments of T, over max_prompt_tokens (the prompt's working tensors,
PROMPT_TOKEN_BYTES a token, in 2 GiB), and B x max_new_tokens over the int32 ids that fit 2 GiB
(the buffer the new tokens are written to).

Code: each signature is a `Signatures` method marked `@signature`, a loop several of them run
`@shared` (`tfxl.saved_model.signature_set`, what every export shares: the functions, batch and
text checks and the request bound; a document classifier's signatures,
`tfxl.classification.signatures`, are built the same way). `export_saved_model` (tfxl-export)
publishes them as a version directory, `export_model` (what `TransfoXLLM.export` calls) at the
given path (`tfxl.saved_model.publish`).
"""

import math

import tensorflow as tf

from tfxl.layers.memory import KEYS, VALID, VALUES, KeyValueMemory
from tfxl.models.generation import generate
from tfxl.models.sampling import sampling_rules
from tfxl.models.scoring import score_document
from tfxl.saved_model.publish import publish_at, publish_version
from tfxl.saved_model.request_checks import (checked, finite_rule, flat, has_rank, ids_rule,
                                             padded_shape, shape_of, shape_rule)
from tfxl.saved_model.signature_set import SignatureSet, most_that_fit, shared, signature
from tfxl.sizing import PROMPT_TOKEN_BYTES, key_value_memory_row_bytes


def _wire(memory):
    """A `KeyValueMemory` as the signatures send it: a dict, float32 keys and values stacked."""
    wire = memory.to_dict()
    return {**wire, KEYS: tf.cast(wire[KEYS], tf.float32),
            VALUES: tf.cast(wire[VALUES], tf.float32)}


# A signature's inputs: name -> (shape in the glossary's letters, "" for a scalar; dtype).
MEMORY = {KEYS: ("B L N H M", tf.float32), VALUES: ("B L N M H", tf.float32),
          VALID: ("B M", tf.bool)}
SAMPLING = {"max_new_tokens": ("", tf.int32), "temperature": ("", tf.float32),
            "top_k": ("", tf.int32), "top_p": ("", tf.float32), "seed": ("", tf.int32)}




class Signatures(SignatureSet):
    """The language model's signatures, one `@signature` method each (module docstring).

    `functions` maps each signature name to its tf.function (with its input_signature), in the
    order of the methods below; `score` is also written as serving_default.
    tgt_len, mem_len, clamp_len, same_length default to `model.config.eval_settings()`;
    score_top_k is K, the size of `score`'s top-k output (0: full log-probs).
    """

    serving_default = "score"

    def __init__(self, model, tokenizer=None, tgt_len=None, mem_len=None, clamp_len=None,
                 same_length=None, score_top_k=16):
        self.settings = model.config.eval_settings(tgt_len=tgt_len, mem_len=mem_len,
                                                   clamp_len=clamp_len, same_length=same_length)
        self.score_top_k = int(score_top_k)
        self.run = dict(clamp_len=self.settings["clamp_len"],
                        same_length=self.settings["same_length"])
        c = model.config
        mem_len = self.settings["mem_len"]
        super().__init__(model, tokenizer, dict(L=c.n_layer, N=c.n_head, H=c.d_head, M=mem_len),
                         most_that_fit(key_value_memory_row_bytes(c, mem_len)))
        self.max_prompt_tokens = most_that_fit(PROMPT_TOKEN_BYTES)
        self.max_new_tokens = most_that_fit(4)

    def _prompt_size_rules(self, what, batch, length, max_new_tokens):
        """B x P (P rounded up to whole segments of T) <= max_prompt_tokens and B x
        max_new_tokens <= max_new_tokens (int32 scalars; max_new_tokens of any shape)."""
        batch, length = tf.cast(batch, tf.int64), tf.cast(length, tf.int64)
        segment_len = self.settings["tgt_len"]
        padded = (length + segment_len - 1) // segment_len * segment_len
        new_tokens = tf.cast(tf.reduce_max(flat(max_new_tokens)), tf.int64)
        return [(batch * padded <= self.max_prompt_tokens,
                 [f"{what}: B x P, P rounded up to whole segments of T={segment_len}, must be at "
                  f"most {self.max_prompt_tokens} tokens (a request's working tensors of at most "
                  "2 GiB), but got B, P =", batch, length]),
                (batch * new_tokens <= self.max_new_tokens,
                 [f"{what}: B x max_new_tokens must be at most {self.max_new_tokens} tokens "
                  "(2 GiB of int32 ids), but got B, max_new_tokens =", batch, new_tokens])]

    # -- request checks (see tfxl.saved_model.request_checks) -----------------------------
    def _memory_rules(self, what, ids, keys, values, valid):
        """The memory fits the export (MEMORY's shapes) and the batch B of `ids`; its keys and
        values are finite (everywhere: a NaN in a valid slot makes every log-prob NaN)."""
        sizes = dict(self.sizes, B=padded_shape(ids, 2)[0])
        return [shape_rule(f"{what}: {name}", tensor, [sizes[d] for d in shape.split()],
                           f"[{', '.join(shape.split())}] (B: the token batch; the others fixed "
                           "by the export)")
                for tensor, (name, (shape, _)) in zip((keys, values, valid), MEMORY.items())] + [
            finite_rule(f"{what}: {KEYS}", keys), finite_rule(f"{what}: {VALUES}", values)]

    @staticmethod
    def _sampling_rules(what, max_new_tokens, temperature, top_k, top_p, seed):
        scalars = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                       top_p=top_p, seed=seed)
        rules = [shape_rule(f"{what}: {name}", value, [], "[] (a scalar)")
                 for name, value in scalars.items()]
        return rules + [(tf.reduce_all(ok), [f"{what}: {name} {requirement}, but got", value])
                        for name, ok, requirement, value in sampling_rules(
                            flat(max_new_tokens), flat(temperature), flat(top_k), flat(top_p))]

    def _memory(self, keys, values, valid):
        dtype = self.model.compute_dtype
        return KeyValueMemory.from_stacked(tf.cast(keys, dtype), tf.cast(values, dtype), valid)

    # -- signatures ---------------------------------------------------------------------------
    @signature(token_ids=("B T", tf.int32), **MEMORY)
    def score(self, token_ids, keys, values, valid):
        token_ids, keys, values, valid = checked(
            self._token_rules("score: token_ids", token_ids)
            + self._memory_rules("score", token_ids, keys, values, valid),
            token_ids, keys, values, valid)
        log_probs, memory = self.model(token_ids, self._memory(keys, values, valid), **self.run)
        out = _wire(memory)
        log_probs = tf.cast(log_probs, tf.float32)
        if self.score_top_k <= 0:
            out["log_probs"] = log_probs
        else:
            best = tf.math.top_k(log_probs, k=min(self.score_top_k, self.model.config.vocab_size))
            out["top_ids"], out["top_log_probs"] = best.indices, best.values
        return out

    @signature(batch_size=("", tf.int32))
    def init_memory(self, batch_size):
        batch_size, = checked(
            [shape_rule("init_memory: batch_size", batch_size, [], "[] (a scalar)"),
             self._batch_rule("init_memory: batch_size", batch_size)], batch_size)
        return _wire(self.model.init_key_value_memory(batch_size, self.settings["mem_len"]))

    @signature(prompt_ids=("B P", tf.int32), **MEMORY, **SAMPLING)
    def generate(self, prompt_ids, keys, values, valid, max_new_tokens, temperature, top_k,
                 top_p, seed):
        sampling = (max_new_tokens, temperature, top_k, top_p, seed)
        prompt_ids, keys, values, valid, *sampling = checked(
            self._token_rules("generate: prompt_ids", prompt_ids, "P")
            + self._memory_rules("generate", prompt_ids, keys, values, valid)
            + self._sampling_rules("generate", *sampling)
            + self._prompt_size_rules("generate", *tf.unstack(padded_shape(prompt_ids, 2)),
                                      max_new_tokens),
            prompt_ids, keys, values, valid, *sampling)
        ids, memory = self._generate(prompt_ids, keys, values, valid,
                                     tf.ones_like(prompt_ids, tf.bool), *sampling)
        return {"generated_ids": ids, **memory}

    # -- the loops, traced once per export (`shared`) -------------------------------------------
    @shared(prompt_ids=("B P", tf.int32), **MEMORY, prompt_valid=("B P", tf.bool), **SAMPLING)
    def _generate(self, prompt_ids, keys, values, valid, prompt_valid, max_new_tokens,
                  temperature, top_k, top_p, seed):
        """`tfxl.models.generation.generate` on a memory as sent (generate, generate_text)."""
        ids, memory = generate(self.model, prompt_ids, self._memory(keys, values, valid),
                               max_new_tokens, temperature, top_k, top_p, seed,
                               prompt_valid=prompt_valid, tgt_len=self.settings["tgt_len"],
                               **self.run)
        return ids, _wire(memory)

    @shared(token_ids=("B S", tf.int32), target_mask=("B S", tf.float32))
    def _score_document(self, token_ids, target_mask):
        """`tfxl.models.scoring.score_document` (score_document*, score_text); target_mask:
        [B, S - 1]."""
        return score_document(self.model, token_ids, target_mask, **self.settings)

    @signature(token_ids=("B S", tf.int32))
    def score_document(self, token_ids):
        return self._checked_score_document("score_document", token_ids)

    @signature(token_ids=("B S", tf.int32), target_mask=("B S", tf.float32))
    def score_document_masked(self, token_ids, target_mask):
        return self._checked_score_document("score_document_masked", token_ids, target_mask)

    def _checked_score_document(self, what, token_ids, target_mask=None):
        rules = self._token_rules(f"{what}: token_ids", token_ids, "S", min_length=2) + [
            self._batch_rule(f"{what}: token_ids: B", padded_shape(token_ids, 2)[0])]
        if target_mask is not None:
            batch, length = tf.unstack(padded_shape(token_ids, 2))
            rules += [shape_rule(f"{what}: target_mask", target_mask, [batch, length - 1],
                                 "[B, S - 1] (token_ids: [B, S])"),
                      (tf.reduce_all((target_mask == 0) | (target_mask == 1)),
                       [f"{what}: target_mask must be 0 or 1, but got values from",
                        tf.reduce_min(target_mask), "to", tf.reduce_max(target_mask)])]
        token_ids, target_mask = checked(rules, token_ids, target_mask)
        if target_mask is None:
            target_mask = tf.ones_like(token_ids[:, 1:], tf.float32)
        nll, mask = self._score_document(token_ids, target_mask)
        tokens = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
        mean_nll = tf.math.divide_no_nan(tf.reduce_sum(nll),
                                         tf.cast(tf.reduce_sum(tokens), tf.float32))
        return {"nll": nll, "mean_nll": mean_nll, "tokens": tokens}

    @signature(needs_tokenizer=True, prompt=("B", tf.string), **SAMPLING)
    def generate_text(self, prompt, max_new_tokens, temperature, top_k, top_p, seed):
        sampling = (max_new_tokens, temperature, top_k, top_p, seed)
        prompt, *sampling = checked(self._text_rules("generate_text: prompt", prompt)
                                    + self._sampling_rules("generate_text", *sampling),
                                    prompt, *sampling)
        ids, lengths = self._encode("generate_text: prompt", prompt)
        # Bounded before the padded [B, max length] copy is made.
        lengths, values, *sampling = checked(self._prompt_size_rules(
            "generate_text", tf.size(lengths), tf.reduce_max(lengths), sampling[0]),
            lengths, ids.flat_values, *sampling)
        ids = ids.with_flat_values(values)
        # Left-pad to a rectangle: the last column is every prompt's last token.
        padded = tf.reverse(tf.reverse(ids, axis=[1]).to_tensor(0), axis=[1])
        prompt_valid = tf.sequence_mask(lengths, tf.shape(padded)[1])[:, ::-1]
        memory = _wire(self.model.init_key_value_memory(tf.shape(padded)[0],
                                                        self.settings["mem_len"]))
        generated, _ = self._generate(padded, memory[KEYS], memory[VALUES], memory[VALID],
                                      prompt_valid, *sampling)
        return {"text": self.tokenizer.tf_decode(generated)}

    @signature(needs_tokenizer=True, text=("B", tf.string))
    def score_text(self, text):
        text, = checked(self._text_rules("score_text: text", text), text)
        ids, lengths = self._encode("score_text: text", text)
        # Framed as tfxl-prepare frames a document: <eod> first, as context only.
        token_ids = tf.pad(ids.to_tensor(0), [[0, 0], [1, 0]],
                           constant_values=self.tokenizer.eod_id)
        target_mask = tf.sequence_mask(lengths, tf.shape(token_ids)[1] - 1, tf.float32)
        nll, _ = self._score_document(token_ids, target_mask)
        mean = tf.reduce_sum(nll, axis=1) / tf.cast(lengths, tf.float32)
        out = {"nll": nll, "tokens": lengths}
        if self.tokenizer.is_character_level:
            out["bpc"] = mean / math.log(2.0)
        else:
            out["perplexity"] = tf.exp(mean)
        return out

    @signature(needs_tokenizer=True, text=("", tf.string))
    def encode_text(self, text):
        text, = checked([shape_rule("encode_text: text", text, [], "[] (a scalar)")], text)
        return {"ids": tf.cast(self.tokenizer.tf_encode(text[None]).flat_values, tf.int32)}

    @signature(needs_tokenizer=True, ids=("G", tf.int32))
    def decode_ids(self, ids):
        ids, = checked([(has_rank(ids, 1), ["decode_ids: ids must have shape [G], but got",
                                            shape_of(ids)]),
                        ids_rule("decode_ids: ids", ids, self.model.config.vocab_size)], ids)
        return {"text": self.tokenizer.tf_decode(ids[None])[0]}


def export_saved_model(model, output_dir, version=None, tgt_len=None, mem_len=None,
                       clamp_len=None, same_length=None, score_top_k=16, tokenizer=None,
                       data_dir=None):
    """Writes `<output_dir>/<version>/saved_model.pb` with the signatures above; returns its path.

    tgt_len/mem_len/clamp_len/same_length default to the config's evaluation settings;
    score_top_k is the size K of `score`'s top-k output (0: full log-probs). version: a positive
    integer, default the next free one (`tfxl.saved_model.publish.next_version`). An existing
    version directory is never overwritten. The version is built under a temporary name and
    published whole (`tfxl.files.StagedDirectory`, saved_model.pb last on object stores), so TF
    Serving watching `output_dir` never loads half an export. data_dir: where `tokenizer` came
    from, recorded with its vocabulary hash in assets.extra/tfxl_data.json (`tfxl.model_dir`).
    """
    signatures = Signatures(model, tokenizer, tgt_len, mem_len, clamp_len, same_length,
                            score_top_k)
    return publish_version(signatures, output_dir, version, data_dir)


def export_model(model, filepath, verbose=None, *, tgt_len=None, mem_len=None, clamp_len=None,
                 same_length=None, score_top_k=16, tokenizer=None):
    """`TransfoXLLM.export`: the signatures above written at `filepath` itself (no version
    directory), as `keras.Model.export` writes; the text signatures only with a `tokenizer`.

    An existing file or non-empty directory at `filepath` is never overwritten. The export is
    built beside `filepath` and published whole as tfxl-export publishes a version
    (`tfxl.files.StagedDirectory`). verbose (default True, as in Keras) prints the signatures.
    """
    signatures = Signatures(model, tokenizer, tgt_len, mem_len, clamp_len, same_length,
                            score_top_k)
    publish_at(signatures, filepath, verbose)
