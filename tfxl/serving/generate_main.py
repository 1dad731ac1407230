r"""`tfxl-generate`: sample text from a trained model, streamed to the terminal token by token.

    tfxl-generate --model=runs/tiny --data_dir=data/stdlib --prompt="def main(" \
        --max_new_tokens=200 --temperature=0.8 --top_p=0.95 --seed=1
    tfxl-generate --model=exports/tiny/1 --prompt_file=prompt.txt

--model is a .keras file, a tfxl-train model_dir, or an exported SavedModel version directory
(then only its `init_memory` and `generate` signatures are used, and, unless --data_dir is given,
the tokenizer it carries when exported with --data_dir: `encode_text`/`decode_ids`). --data_dir
must hold the vocabulary the model was trained on (checked against model_dir/data.json or the
export's record). The prompt is read as evaluation reads a document: segments of the evaluation
tgt_len on the key/value memory, so a long prompt costs one segment's memory; every new token is
one step. Sizes are bounded before anything is built: --prompt_file at most MAX_PROMPT_BYTES
(checked before it is read), --mem_len and --max_new_tokens at most 2 GiB of memory or token
buffer (`tfxl.models.generation.check_generation_sizes`), each refusal naming the flag. The
same flags and seed give the same text, and the tokens `TransfoXLLM.generate` draws with that
seed (`tfxl.models.generation.token_seed`).
"""

if __name__ == "__main__":  # `python -m`: TensorFlow quiet before the imports below load it
    from tfxl.cli.quiet import quiet_tensorflow
    quiet_tensorflow()

import os
import sys

from absl import flags

from tfxl import cli

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("model", None, "A .keras file, a model_dir, or an export version dir.")
    flags.DEFINE_string("data_dir", None, "tfxl-prepare directory (for its tokenizer; not needed "
                        "with an export made with --data_dir).")
    flags.DEFINE_string("prompt", None, "Prompt text.")
    flags.DEFINE_string("prompt_file", None, "Read the prompt from this file.")
    flags.DEFINE_integer("max_new_tokens", 200, "Tokens to generate.")
    flags.DEFINE_float("temperature", 1.0, "Sampling temperature; 0 = greedy.")
    flags.DEFINE_integer("top_k", 0, "Keep the k most likely tokens (0 = all).")
    flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass (1 = off).")
    flags.DEFINE_integer("seed", 0, "Random seed (an int32: the exported signatures' type).",
                         lower_bound=-2**31, upper_bound=2**31 - 1)
    cli.define_eval_flags(["mem_len"], note="; fixed by the export for SavedModels")


class _ModelStepper:
    """One token per call from a Keras model, memory carried in Python between calls."""

    def __init__(self, model, mem_len):
        import tensorflow as tf

        from tfxl.models.generation import generate
        self.tf = tf
        settings = model.config.eval_settings(mem_len=mem_len)
        self.mem_len = settings["mem_len"]
        run = dict(clamp_len=settings["clamp_len"], same_length=settings["same_length"])
        self.memory = model.init_key_value_memory(1, mem_len=self.mem_len)
        # Any prompt length: one trace for the prompt and every later token, not two.
        self._generate = tf.function(lambda ids, memory, t, k, p, seed: generate(
            model, ids, memory, 1, t, k, p, seed, **run), input_signature=[
                tf.TensorSpec([None, None], tf.int32),
                tf.nest.map_structure(lambda value: tf.TensorSpec(
                    [None, *value.shape[1:]], value.dtype), self.memory),
                *[tf.TensorSpec([], dtype) for dtype in (tf.float32, tf.int32, tf.float32,
                                                         tf.int32)]])

    def __call__(self, ids, temperature, top_k, top_p, seed):
        tf = self.tf
        token, self.memory = self._generate(
            tf.constant(ids, tf.int32), self.memory, tf.constant(temperature, tf.float32),
            tf.constant(top_k), tf.constant(top_p, tf.float32), tf.constant(seed))
        return token


class _ExportStepper:
    """The same through an exported SavedModel's `generate` signature (imports only TF)."""

    def __init__(self, path):
        import tensorflow as tf

        from tfxl.saved_model.reading import load_export
        self.tf = tf
        self.signatures = load_export(path).signatures
        if "generate" not in self.signatures:
            raise ValueError(f"{path} has no `generate` signature; is it a tfxl export?")
        self.memory = self.signatures["init_memory"](batch_size=tf.constant(1))

    def __call__(self, ids, temperature, top_k, top_p, seed):
        tf = self.tf
        out = self.signatures["generate"](
            prompt_ids=tf.constant(ids, tf.int32), max_new_tokens=tf.constant(1),
            temperature=tf.constant(temperature, tf.float32), top_k=tf.constant(top_k),
            top_p=tf.constant(top_p, tf.float32), seed=tf.constant(seed), **self.memory)
        self.memory = {name: out[name] for name in ("keys", "values", "valid")}
        return out["generated_ids"]


class _ExportTokenizer:
    """The tokenizer an export made with --data_dir carries (encode_text/decode_ids)."""

    def __init__(self, signatures):
        import tensorflow as tf
        self.tf, self.signatures = tf, signatures

    def encode(self, text):
        return self.signatures["encode_text"](text=self.tf.constant(text))["ids"].numpy()

    def decode(self, ids):
        text = self.signatures["decode_ids"](ids=self.tf.constant(ids, self.tf.int32))["text"]
        return text.numpy().decode("utf-8")


def utf8_text(data, where):
    """bytes `data` as text; ValueError naming `where` (a flag) and the first invalid byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{where} is not UTF-8 text: byte {data[err.start]:#04x} at offset "
                         f"{err.start} ({err.reason}); the tokenizers read UTF-8") from None


# The most a prompt file may hold: ample for any prompt (16 Mi byte tokens are 250k segments
# of 64), and refused before it is read whole, so a huge file never reaches memory.
MAX_PROMPT_BYTES = 16 * 2**20


def read_prompt(path, limit=None):
    """The text of --prompt_file (UTF-8), local or a bucket (tf.io.gfile); a file over `limit`
    bytes (default MAX_PROMPT_BYTES) is refused from its size, before it is read, and a file
    that grows past it (a pipe, a file still being written) after `limit` + 1 bytes."""
    import tensorflow as tf
    limit = MAX_PROMPT_BYTES if limit is None else limit
    too_large = (f"--prompt_file={path} holds {{}} bytes; a prompt may hold at most {limit} "
                 f"bytes ({limit // 2**20} MiB)")
    try:
        size = tf.io.gfile.stat(path).length
        if size > limit:
            raise ValueError(too_large.format(size))
        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read(limit + 1)
    except (OSError, tf.errors.OpError) as err:
        raise ValueError(f"--prompt_file={path}: cannot read ({cli.one_line(err)})") from None
    if len(data) > limit:
        raise ValueError(too_large.format(f"more than {limit}"))
    return utf8_text(data, f"--prompt_file={path}")


def check_sizes(config):
    """--mem_len (or the config's) and --max_new_tokens fit (check_generation_sizes), the flag
    or the config field named: before any memory is built."""
    from tfxl.models.generation import check_generation_sizes
    sources = config.eval_settings_sources(mem_len=FLAGS.mem_len)
    settings = {key: value for key, (value, _) in sources.items()}
    names = {key: (f"--{key}" if source == "argument" else f"the config's {source}")
             for key, (_, source) in sources.items()}
    check_generation_sizes(config, 1, settings["mem_len"], settings["tgt_len"],
                           FLAGS.max_new_tokens, {**names, "max_new_tokens": "--max_new_tokens"})


def main(argv):
    del argv
    if not FLAGS.model:
        raise ValueError("--model is required")
    if (FLAGS.prompt is None) == (FLAGS.prompt_file is None):
        raise ValueError("give exactly one of --prompt and --prompt_file")
    from tfxl.models.sampling import check_sampling
    check_sampling(FLAGS.max_new_tokens, FLAGS.temperature, FLAGS.top_k, FLAGS.top_p)
    from tfxl.models.generation import check_new_tokens
    check_new_tokens(1, FLAGS.max_new_tokens, "--max_new_tokens")
    # A non-UTF-8 argument reaches Python as surrogate escapes (PEP 383): back to its bytes.
    prompt = (read_prompt(FLAGS.prompt_file) if FLAGS.prompt_file
              else utf8_text(os.fsencode(FLAGS.prompt), "--prompt"))
    from tfxl.model_dir import export_vocab_size
    from tfxl.checkpoints.loading import (EXPORT, load_checked_tokenizer, load_language_model,
                                     model_kind)
    if model_kind(FLAGS.model) == EXPORT:
        if FLAGS.data_dir:  # checked before the (slow) load
            tokenizer = load_checked_tokenizer(FLAGS.data_dir, FLAGS.model,
                                               export_vocab_size(FLAGS.model))
        step = _ExportStepper(FLAGS.model)
        if not FLAGS.data_dir:
            if "decode_ids" not in step.signatures:
                raise ValueError(f"{FLAGS.model} carries no tokenizer (exported without "
                                 "--data_dir): pass --data_dir")
            tokenizer = _ExportTokenizer(step.signatures)
    else:
        if not FLAGS.data_dir:
            raise ValueError("--data_dir is required (only an export made with --data_dir "
                             "carries its tokenizer)")
        model = load_language_model(FLAGS.model)
        check_sizes(model.config)
        tokenizer = load_checked_tokenizer(FLAGS.data_dir, FLAGS.model, model.config.vocab_size)
        step = _ModelStepper(model, FLAGS.mem_len)
    ids = tokenizer.encode(prompt)
    if ids.size == 0:
        raise ValueError("the prompt encodes to no tokens")

    from tfxl.models.generation import token_seed
    generated, shown = [], ""
    prompt_ids = ids[None, :]
    for i in range(FLAGS.max_new_tokens):
        # One token per call, seeded as token i of one call: TransfoXLLM.generate's tokens.
        token = step(prompt_ids, FLAGS.temperature, FLAGS.top_k, FLAGS.top_p,
                     token_seed(FLAGS.seed, i))
        token = int(token[0, 0])
        generated.append(token)
        prompt_ids = [[token]]
        text = tokenizer.decode(generated)
        # Print only what is new; a partial UTF-8 sequence shows once it is complete.
        stable = text.rstrip("\ufffd")
        if stable.startswith(shown):
            sys.stdout.write(stable[len(shown):])
            sys.stdout.flush()
            shown = stable
    text = tokenizer.decode(generated)
    sys.stdout.write(text[len(shown):] + "\n")
    return 0


def run():
    cli.run(main, define_flags)


if __name__ == "__main__":
    run()
