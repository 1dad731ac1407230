"""Benchmark: tfxl on JAX and the Hugging Face PyTorch Transformer-XL on one accelerator,
falling back to the CPU where no accelerator is seen.

Shape glossary: B batch, T segment length, M memory length, V vocabulary size.

For each preset (`wt103_base`, `enwik8_base`: tfxl/config.py, the original scripts' settings) and
each precision (fp32 and bf16 mixed), in one run on one device:

  * training tokens/s at the paper's batch (wt103_base B 60, enwik8_base B 24) and training T = M:
    tfxl as tfxl-train trains on JAX, through its own step, with the input from numpy in place of
    tf.data: the model built under `resolve_distribution("data_parallel")` (tfxl/tpu/jax_mesh.py)
    after the dtype policy and seed are set, the language model's task
    (train/tasks/language_model.py: token-weighted mean NLL of all T targets, dropout on, the
    layer-input memory carried from step to step), and `JaxTrainStep.train(--steps)`
    (train/loop/jax_train_step.py: one compiled host loop of that many steps, a `lax.scan`, with the
    weights, optimizer variables and memory donated; tfxl-train's default optimizer, Adam 2.5e-4
    on its cosine schedule, and its global-norm clipping at 0.25); each timed loop is one such
    call, its input (`ZipfStreams`, the batches tfxl's pipeline gives) stacked and placed on the
    mesh inside it, as tfxl-train does; the peer: `TransfoXLLMHeadModel`, torch Adam,
    `clip_grad_norm_(0.25)`, its `mems` fed back;
  * evaluation tokens/s at the presets' evaluation settings (wt103_base T 64 / M 640 / clamp 400,
    enwik8_base T 80 / M 2100 / clamp 820, same_length), batch 10 (the original PyTorch
    eval.py's default): tfxl's key/value ring (one jitted segment step, position keys computed
    once, the ring donated so each segment is written into it in place); the peer under
    `torch.no_grad()` with its layer-input `mems`;
  * generation ms/token at batch 1 and 32 on a memory of the evaluation M slots, greedy: tfxl
    through `TransfoXLLM.generate` (one `jax.jit` loop, `ops.while_loop`, per shape; static
    shapes, so every token attends over all M slots, valid or not); the peer: one
    `model.transformer` call per token with its `mems`, the log-probs from its adaptive
    softmax, argmax. ms/token = (time of 1 + n tokens - time of 1 token) / n, so the call
    overhead cancels;
  * model FLOP/s (`common.forward_flops`; training = 3 x forward; the adaptive softmax's tail
    clusters counted for every token, which tfxl's static tail path on JAX does compute) against
    the device's peak, measured as the best of chained [n, n] matmuls in bf16 and in fp32 with
    each framework (the table uses the better of the two).

fp32 means float32 weights and activations with TF32 matmuls on GPUs that have them (JAX's
`jax_default_matmul_precision` "tensorfloat32", torch's allow_tf32), as NVIDIA's published
Transformer-XL figures;
`--fp32_matmul highest` asks both for full float32 instead. bf16 means Keras' "mixed_bfloat16"
policy (float32 weights, bfloat16 compute) and `torch.autocast(dtype=torch.bfloat16)`.

Token ids are drawn from a Zipf(1) law over the ids (both vocabularies are frequency-sorted:
~80% of wt103's tokens fall in the 20,000-word head), the same for both; the speed of tfxl's
static tail path does not depend on them, the peer's sparse one does. Weights are random.

Timing: warm-up calls (compilation included) are not timed (tfxl's training: `--warmup` steps
rounded up to whole host loops); each measurement is `--repeats` timed loops of `--steps` steps
(segments), each loop ended by `jax.block_until_ready` (tfxl's training: the host loop's losses
read back) / `torch.cuda.synchronize`; the median loop is reported (the best beside it in the
JSON).

Each framework runs in its own subprocess, one per preset (a JAX process keeps the GPU memory it
took), which never imports TensorFlow (checked: `tensorflow_loaded` in each row); results are
written to `--out` after every process, so a run cut short keeps what it measured.

    python -m benchmarks.accelerator_bench [--smoke] [--presets wt103_base,enwik8_base]
        [--dtypes fp32,bf16] [--phases train,eval,generate] [--steps N] [--repeats N]
        [--tokens N] [--peer auto|on|off] [--out results.json]

Not the `tfxl-train` command: on JAX it still needs TensorFlow around its step (tf.data input,
TensorFlow-format checkpoints, tf.summary), which the GPU machine lacks; its step
(`JaxTrainStep`, `resolve_distribution`) does not, and is what the training rows time.
benchmarks/accelerator_run.sh's header says where the rest needs TensorFlow.

`--smoke`: a 2-layer model of each preset's shape (tail clusters for wt103), few steps: the check
that the harness runs (CPU, JAX), not a measurement. benchmarks/accelerator_run.sh runs it on the
GPU machine (its results: BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common

PRESETS = ("wt103_base", "enwik8_base")
DTYPES = {"fp32": "float32", "bf16": "mixed_bfloat16"}
PHASES = ("train", "eval", "generate")
# The paper's training batch per preset (the original scripts: shared/reference-notes.md).
TRAIN_BATCH = {"wt103_base": 60, "enwik8_base": 24}
EVAL_BATCH = 10  # the original PyTorch eval.py's --batch_size default
GENERATE_BATCHES = (1, 32)
SMOKE_SHAPE = dict(n_layer=2, d_model=64, n_head=2, d_head=32, d_inner=128, tgt_len=16,
                   mem_len=16, eval_tgt_len=8, eval_mem_len=32, eval_clamp_len=24)
SMOKE_VOCAB = {"wt103_base": dict(vocab_size=1000, cutoffs=(100, 200, 600)),
               "enwik8_base": dict(vocab_size=204)}
SMOKE_BATCH = 4
PEER = "HF transformers 4.46 TransfoXLLMHeadModel (PyTorch, eager)"


def preset_config(name, smoke=False):
    from tfxl.config import get_preset
    if smoke:
        return get_preset(name, **SMOKE_SHAPE, **SMOKE_VOCAB[name])
    return get_preset(name)


def batches(name, smoke):
    """(training batch, evaluation batch)."""
    return (SMOKE_BATCH, 2) if smoke else (TRAIN_BATCH[name], EVAL_BATCH)


def zipf_ids(vocab_size, shape, seed=0):
    """Token ids with P(id) proportional to 1 / (id + 1): a frequency-sorted vocabulary."""
    import numpy as np
    weights = 1.0 / np.arange(1, vocab_size + 1)
    rng = np.random.default_rng(seed)
    return rng.choice(vocab_size, size=shape, p=weights / weights.sum()).astype(np.int32)


def timed_loops(run_loop, repeats):
    """Seconds of each of `repeats` calls of run_loop() (each ends synchronized)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run_loop()
        times.append(time.perf_counter() - start)
    return times


def summary(times, work):
    """Median and best rate of `work` units over the loop times, and the median loop time."""
    med = statistics.median(times)
    return {"median_per_s": work / med, "best_per_s": work / min(times), "loop_s": times}


def timed_segments(step_segment, ids, seg_len, warmup, steps, repeats, work_per_step):
    """Feeds consecutive [B, T] segments of `ids` (inputs, next-token targets) to
    `step_segment(inputs, targets)`, which returns an array to synchronize on: `warmup` steps
    (compilation included), then `repeats` timed loops of `steps`. Returns (warmup seconds,
    `summary` of the loops, loop seconds)."""
    import jax
    count = warmup + steps * repeats
    segments = [(jax.device_put(ids[:, i * seg_len:(i + 1) * seg_len]),
                 jax.device_put(ids[:, i * seg_len + 1:(i + 1) * seg_len + 1]))
                for i in range(count)]
    position = {"next": 0}

    def run(n):
        out = None
        for _ in range(n):
            out = step_segment(*segments[position["next"]])
            position["next"] += 1
        jax.block_until_ready(out)

    start = time.perf_counter()
    run(warmup)
    warmup_s = time.perf_counter() - start
    times = timed_loops(lambda: run(steps), repeats)
    return warmup_s, summary(times, steps * work_per_step), times


START = time.perf_counter()


def emit(row):
    """One result line for the parent (flushed: a child cut short keeps what it printed), with
    the seconds since the process started (`at_s`: where a run's time goes)."""
    row["at_s"] = round(time.perf_counter() - START, 1)
    row["tensorflow_loaded"] = any((m == "tensorflow" or m.startswith("tensorflow."))
                                   and module is not None for m, module in sys.modules.items())
    print("RESULT " + json.dumps(row, default=float), flush=True)


# -- tfxl on JAX (child process) ----------------------------------------------------------------
def jax_matmul_peak(dtype, n, seconds):
    import jax
    import jax.numpy as jnp
    reps = 8
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(dtype)
    b = (jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32) / n ** 0.5).astype(dtype)

    @jax.jit
    def chain(x, w):
        for _ in range(reps):
            x = x @ w
        return x

    chain(a, b).block_until_ready()
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        chain(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return reps * 2 * n ** 3 / best


def _variables(model):
    """The model's (trainable, non-trainable) variable values."""
    return ([v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables])


class ZipfStreams:
    """The train split as `JaxTrainStep` reads tfxl-prepare's (`dataset(split, batch, training,
    skip_batches).as_numpy_iterator()`), from numpy in place of tf.data: each row one stream of
    `zipf_ids`, cut into consecutive segments, every target real, the batches tfxl's pipeline
    gives (int32 inputs, targets, target_mask [B, T]; reset [B], 1 at a stream's start)."""

    def __init__(self, vocab_size, batch, tgt_len, segments):
        self.tgt_len = tgt_len
        self.ids = zipf_ids(vocab_size, (batch, segments * tgt_len + 1))

    def dataset(self, split, batch, training, skip_batches=0):
        import numpy as np
        del split, training
        assert batch == self.ids.shape[0], (batch, self.ids.shape)
        t, ids = self.tgt_len, self.ids
        segments = (ids.shape[1] - 1) // t

        def batches():
            for i in range(skip_batches, segments):
                yield {"inputs": ids[:, i * t:(i + 1) * t],
                       "targets": ids[:, i * t + 1:(i + 1) * t + 1],
                       "target_mask": np.ones((batch, t), np.int32),
                       "reset": np.full((batch,), int(i == 0), np.int32)}

        return _NumpyDataset(batches)


class _NumpyDataset:
    """What the step asks of a tf.data.Dataset: `as_numpy_iterator()`."""

    def __init__(self, batches):
        self.as_numpy_iterator = batches


def tfxl_train(model, strategy, config, batch, steps, repeats, warmup, mixed_precision):
    """tfxl-train's step on JAX: `JaxTrainStep.train(steps)`, one compiled host loop of `steps`
    steps (`lax.scan`) with the weights, optimizer variables and memory donated; the language
    model's task (the token-weighted mean NLL, dropout on, the layer-input memory), tfxl-train's
    default optimizer (Adam, 2.5e-4, cosine schedule) and global-norm clipping (0.25). `warmup`
    untimed steps, rounded up to whole loops (the first compiles)."""
    from tfxl.train import backends
    from tfxl.train.tasks.language_model import LanguageModelTask
    from tfxl.train.loop.optimization import OptimizerParams

    warmup_loops = max(1, -(-warmup // steps))
    data = ZipfStreams(config.vocab_size, batch, config.tgt_len,
                       (warmup_loops + repeats) * steps)
    step = backends.for_strategy(strategy).train_step(
        LanguageModelTask(config, data_dir="(numpy)"), model, data=data, global_batch=batch,
        optimizer=OptimizerParams(), mixed_precision=mixed_precision)
    state = {"loss": None}

    def run_loop():
        # Returns the losses as numpy: the device has finished the loop.
        state["loss"] = step.train(steps)["loss"][-1]

    start = time.perf_counter()
    for _ in range(warmup_loops):
        run_loop()
    warmup_s = time.perf_counter() - start
    times = timed_loops(run_loop, repeats)
    result = summary(times, steps * batch * config.tgt_len)
    return {"batch": batch, "tgt_len": config.tgt_len, "mem_len": config.mem_len,
            "steps": steps, "repeats": repeats, "warmup_s": warmup_s,
            "path": "tfxl-train's JaxTrainStep.train(steps), numpy input",
            "steps_per_loop": steps, "warmup_steps": warmup_loops * steps,
            "tokens_per_s": result["median_per_s"], "best_tokens_per_s": result["best_per_s"],
            "loop_s": result["loop_s"], "final_loss": float(state["loss"]),
            "flops_per_step": common.train_flops(config, batch),
            "flop_per_s": common.train_flops(config, batch) * steps / statistics.median(times)}


def tfxl_eval(model, config, batch, steps, repeats, warmup):
    import jax
    import jax.numpy as jnp
    from keras import ops

    settings = config.eval_settings()
    t, m = settings["tgt_len"], settings["mem_len"]
    trainable, non_trainable = _variables(model)
    position_keys = model.position_keys(m + t, settings["clamp_len"])
    # The key/value ring, as tfxl's evaluation reads it: donated, so XLA writes each segment
    # into its buffers in place. One buffer per leaf (an empty ring shares one zero tensor
    # between its layers).
    memory = jax.tree_util.tree_map(jnp.copy, model.init_key_value_ring(batch, t, m))

    def eval_step(trainable, non_trainable, memory, position_keys, ids, targets):
        (nll, memory), _ = model.stateless_call(
            trainable, non_trainable, ids, memory, targets=targets, training=False,
            clamp_len=settings["clamp_len"], same_length=settings["same_length"],
            position_keys=position_keys)
        return memory, ops.sum(nll)

    step = jax.jit(eval_step, donate_argnums=(2,))
    ids = zipf_ids(config.vocab_size, (batch, (warmup + steps * repeats) * t + 1), seed=1)
    state = {"memory": memory}

    def step_segment(seg_ids, targets):
        state["memory"], nll = step(trainable, non_trainable, state["memory"], position_keys,
                                    seg_ids, targets)
        return nll

    warmup_s, result, times = timed_segments(step_segment, ids, t, warmup, steps, repeats,
                                             batch * t)
    flops = common.forward_flops(config, batch, t, m, key_value_memory=True)
    return {"batch": batch, "tgt_len": t, "mem_len": m, "clamp_len": settings["clamp_len"],
            "same_length": settings["same_length"], "steps": steps, "repeats": repeats,
            "warmup_s": warmup_s, "tokens_per_s": result["median_per_s"],
            "best_tokens_per_s": result["best_per_s"], "loop_s": result["loop_s"],
            "flops_per_step": flops, "flop_per_s": flops * steps / statistics.median(times)}


def tfxl_generate(model, config, batch, tokens, repeats):
    """Greedy `TransfoXLLM.generate` (one jitted loop per shape on JAX) from a 1-token prompt;
    its memory has the evaluation M slots from the start (static shapes: empty slots are masked,
    not skipped), so each token costs what it costs on a full memory."""
    mem_len = config.eval_settings()["mem_len"]
    prompt = [[1]] * batch

    def timed(n):
        start = time.perf_counter()
        model.generate(prompt, n, temperature=0.0)  # returns numpy: the device has finished
        return time.perf_counter() - start
    timed(1), timed(1 + tokens)  # compile (N is static: one compilation each) / warm up
    one, many = [], []
    for _ in range(repeats):  # interleaved
        one.append(timed(1))
        many.append(timed(1 + tokens))
    ms = 1e3 * (statistics.median(many) - statistics.median(one)) / tokens
    best_ms = 1e3 * (min(many) - min(one)) / tokens
    return {"batch": batch, "mem_len": mem_len, "tokens": tokens, "repeats": repeats,
            "ms_per_token": ms, "best_ms_per_token": best_ms,
            "one_token_s": one, "many_tokens_s": many}


def run_tfxl(args):
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import keras
    if keras.backend.backend() != "jax":
        raise SystemExit(f"the tfxl part runs on JAX; KERAS_BACKEND is {keras.backend.backend()}")
    warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")
    device = jax.devices()[0]
    if device.platform == "gpu":  # said, not left to the default
        jax.config.update("jax_default_matmul_precision",
                          "highest" if args.fp32_matmul == "highest" else "tensorfloat32")
    info = {"framework": "tfxl", "backend": f"Keras {keras.__version__} on JAX {jax.__version__}",
            "device": f"{device.platform}: {getattr(device, 'device_kind', device)}"}
    n = args.matmul_n or (8192 if device.platform == "gpu" else 512 if args.smoke else 2048)
    for name, dtype in (("bf16", "bfloat16"), ("fp32", "float32")):
        emit({**info, "preset": args.presets[0], "phase": "matmul_peak", "dtype": name, "n": n,
              "flop_per_s": jax_matmul_peak(dtype, n, 0.2 if args.smoke else 3.0)})
    for preset in args.presets:
        run_tfxl_preset(args, {**info, "preset": preset})


def run_tfxl_preset(args, info):
    import jax
    import keras
    from tfxl.tpu.jax_mesh import resolve_distribution
    from tfxl.train.tasks.language_model import build_model

    config = preset_config(info["preset"], args.smoke)
    train_batch, eval_batch = batches(info["preset"], args.smoke)
    # tfxl-train's default strategy on JAX: data parallel over every device (one here).
    strategy = resolve_distribution("data_parallel")
    for name in args.dtypes:
        # As tfxl-train: the policy and the seed, then the model built under the strategy.
        keras.config.set_dtype_policy(DTYPES[name])
        keras.utils.set_random_seed(0)
        model = build_model(config, strategy)
        row = {**info, "dtype": name, "parameters": int(model.count_params())}
        if "train" in args.phases:
            emit({**row, "phase": "train", **tfxl_train(
                model, strategy, config, train_batch, args.steps, args.repeats, args.warmup,
                DTYPES[name])})
        if "eval" in args.phases:
            emit({**row, "phase": "eval", **tfxl_eval(model, config, eval_batch, args.steps,
                                                       args.repeats, args.warmup)})
        if "generate" in args.phases:
            for batch in args.generate_batches:
                emit({**row, "phase": "generate",
                      **tfxl_generate(model, config, batch, args.tokens, args.repeats)})
        del model
        keras.backend.clear_session()
        jax.clear_caches()
    keras.config.set_dtype_policy("float32")


# -- the PyTorch peer (child process) -----------------------------------------------------------
def peer_model(torch, config, device):
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel
    c = config
    hf = TransfoXLConfig(
        vocab_size=c.vocab_size, n_layer=c.n_layer, d_model=c.d_model, d_embed=c.embed_dim,
        n_head=c.n_head, d_head=c.d_head, d_inner=c.d_inner, cutoffs=list(c.cutoffs),
        adaptive=bool(c.cutoffs), div_val=c.div_val, tie_projs=list(c.cluster_tie_projs),
        tie_word_embeddings=c.tie_weight, dropout=c.dropout, dropatt=c.dropatt,
        mem_len=c.mem_len, clamp_len=c.clamp_len, same_length=c.same_length, untie_r=c.untie_r,
        pre_lnorm=c.pre_lnorm, init_std=c.init_std, proj_init_std=c.proj_init_std,
        layer_norm_epsilon=c.layer_norm_epsilon)
    torch.manual_seed(0)
    return TransfoXLLMHeadModel(hf).to(device)


def _settings(model, mem_len, clamp_len, same_length):
    """The HF model's memory length, clamp and same_length (attributes its forward reads)."""
    transformer = model.transformer
    transformer.mem_len, transformer.clamp_len = mem_len, clamp_len
    transformer.same_length = same_length


def _segment_nll(torch, model, ids, targets, mems, state):
    """NLL [B * T] of all T targets (HF's labels= path shifts inside the segment and scores T - 1:
    a padding row at the end and a dummy first label make its shift the identity) and the mems.

    Under autocast, where the softmax's log-probabilities come out in another dtype than its
    output buffer (CPU autocast keeps log_softmax in bf16), the softmax layer runs in float32
    (noted in the row as softmax_fp32)."""
    out = model.transformer(input_ids=ids, mems=mems)
    hidden = out.last_hidden_state  # [B, T, D]
    hidden = torch.cat([hidden, hidden.new_zeros(hidden.shape[0], 1, hidden.shape[2])], 1)
    labels = torch.cat([targets[:, :1], targets], 1)
    if not state.get("softmax_fp32"):
        try:
            return model.crit(hidden, labels), out.mems
        except RuntimeError as error:
            if "dtype" not in str(error) or not torch.is_autocast_enabled(hidden.device.type):
                raise
            state["softmax_fp32"] = True
    with torch.autocast(hidden.device.type, enabled=False):
        return model.crit(hidden.float(), labels), out.mems


def _sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def torch_matmul_peak(torch, device, dtype, n, seconds):
    reps = 8
    a = torch.randn(n, n, device=device).to(dtype)
    b = (torch.randn(n, n, device=device) / n ** 0.5).to(dtype)

    def chain():
        x = a
        for _ in range(reps):
            x = x @ b
        return x

    chain()
    _sync(torch, device)
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        chain()
        _sync(torch, device)
        best = min(best, time.perf_counter() - start)
    return reps * 2 * n ** 3 / best


def peer_train(torch, model, config, device, batch, steps, repeats, warmup):
    _settings(model, config.mem_len, config.clamp_len, config.same_length)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=2.5e-4)
    t, count = config.tgt_len, warmup + steps * repeats
    ids = torch.from_numpy(zipf_ids(config.vocab_size, (batch, count * t + 1))).long().to(device)
    state = {"i": 0, "mems": None, "loss": None}

    def run(n):
        for _ in range(n):
            i = state["i"]
            nll, mems = _segment_nll(torch, model, ids[:, i * t:(i + 1) * t],
                                     ids[:, i * t + 1:(i + 1) * t + 1], state["mems"], state)
            loss = nll.float().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            optimizer.step()
            state.update(i=i + 1, mems=mems, loss=loss.detach())
        _sync(torch, device)

    start = time.perf_counter()
    run(warmup)
    warmup_s = time.perf_counter() - start
    times = timed_loops(lambda: run(steps), repeats)
    result = summary(times, steps * batch * t)
    return {"batch": batch, "tgt_len": t, "mem_len": config.mem_len, "steps": steps,
            "repeats": repeats, "warmup_s": warmup_s, "tokens_per_s": result["median_per_s"],
            "best_tokens_per_s": result["best_per_s"], "loop_s": result["loop_s"],
            "final_loss": float(state["loss"]), "softmax_fp32": bool(state.get("softmax_fp32")),
            "flops_per_step": common.train_flops(config, batch),
            "flop_per_s": common.train_flops(config, batch) * steps / statistics.median(times)}


def peer_eval(torch, model, config, device, batch, steps, repeats, warmup):
    s = config.eval_settings()
    t, m = s["tgt_len"], s["mem_len"]
    _settings(model, m, s["clamp_len"], s["same_length"])
    model.eval()
    count = warmup + steps * repeats
    ids = torch.from_numpy(zipf_ids(config.vocab_size, (batch, count * t + 1), seed=1))
    ids = ids.long().to(device)
    state = {"i": 0, "mems": None, "nll": None}

    def run(n):
        for _ in range(n):
            i = state["i"]
            nll, mems = _segment_nll(torch, model, ids[:, i * t:(i + 1) * t],
                                     ids[:, i * t + 1:(i + 1) * t + 1], state["mems"], state)
            state.update(i=i + 1, mems=mems, nll=nll.float().sum())
        _sync(torch, device)

    with torch.no_grad():
        start = time.perf_counter()
        run(warmup)
        warmup_s = time.perf_counter() - start
        times = timed_loops(lambda: run(steps), repeats)
    result = summary(times, steps * batch * t)
    # The peer projects keys and values of all M + T rows per layer (its layer-input memory).
    flops = common.forward_flops(config, batch, t, m)
    return {"batch": batch, "tgt_len": t, "mem_len": m, "clamp_len": s["clamp_len"],
            "same_length": s["same_length"], "steps": steps, "repeats": repeats,
            "warmup_s": warmup_s, "tokens_per_s": result["median_per_s"],
            "best_tokens_per_s": result["best_per_s"], "loop_s": result["loop_s"],
            "softmax_fp32": bool(state.get("softmax_fp32")),
            "flops_per_step": flops, "flop_per_s": flops * steps / statistics.median(times)}


def peer_generate(torch, model, config, device, batch, tokens, repeats):
    s = config.eval_settings()
    m = s["mem_len"]
    _settings(model, m, s["clamp_len"], s["same_length"])
    model.eval()
    generator = torch.Generator(device="cpu").manual_seed(2)
    mems0 = [(0.5 * torch.randn(m, batch, config.d_model, generator=generator)).to(device)
             for _ in range(config.n_layer)]

    def timed(n):
        mems, token = mems0, torch.ones(batch, 1, dtype=torch.long, device=device)
        start = time.perf_counter()
        for _ in range(n):
            out = model.transformer(input_ids=token, mems=mems)
            log_probs = model.crit(out.last_hidden_state[:, -1])  # [B, V]
            token, mems = log_probs.argmax(-1, keepdim=True), out.mems
        _sync(torch, device)
        return time.perf_counter() - start

    with torch.no_grad():
        timed(1), timed(1 + tokens)  # warm up
        one, many = [], []
        for _ in range(repeats):
            one.append(timed(1))
            many.append(timed(1 + tokens))
    return {"batch": batch, "mem_len": m, "tokens": tokens, "repeats": repeats,
            "path": "model.transformer per token, mems", "ms_per_token":
            1e3 * (statistics.median(many) - statistics.median(one)) / tokens,
            "best_ms_per_token": 1e3 * (min(many) - min(one)) / tokens,
            "one_token_s": one, "many_tokens_s": many}


def run_peer(args):
    os.environ["USE_TF"] = "0"  # transformers must not import TensorFlow where it is installed
    import torch
    import transformers
    from benchmarks.peer_bench import patch_type_as

    patch_type_as(torch)
    transformers.logging.set_verbosity_error()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # Subnormal floats: XLA's CPU code flushes them to zero, eager torch does not, and on the
    # CPU its smoke run's wt103-shaped step was 18x slower for them (6.7 s against 0.38 s).
    torch.set_flush_denormal(True)
    if device.type == "cuda":
        allow = args.fp32_matmul == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = allow
        torch.backends.cudnn.allow_tf32 = allow
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else common.cpu_model()
    info = {"framework": "peer", "backend": f"transformers {transformers.__version__}, torch "
            f"{torch.__version__}", "device": f"{device.type}: {name}"}
    n = args.matmul_n or (8192 if device.type == "cuda" else 512 if args.smoke else 2048)
    for dname, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        emit({**info, "preset": args.presets[0], "phase": "matmul_peak", "dtype": dname, "n": n,
              "flop_per_s": torch_matmul_peak(torch, device, dtype, n,
                                              0.2 if args.smoke else 3.0)})
    for preset in args.presets:
        run_peer_preset(torch, device, args, {**info, "preset": preset})


def run_peer_preset(torch, device, args, info):
    import contextlib
    config = preset_config(info["preset"], args.smoke)
    train_batch, eval_batch = batches(info["preset"], args.smoke)
    model = peer_model(torch, config, device)
    row = {**info, "parameters": sum(p.numel() for p in model.parameters())}
    for dname in args.dtypes:
        row["dtype"] = dname
        autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if dname == "bf16"
                    else contextlib.nullcontext())
        with autocast:
            if "train" in args.phases:
                emit({**row, "phase": "train", **peer_train(
                    torch, model, config, device, train_batch, args.steps, args.repeats,
                    args.warmup)})
            if "eval" in args.phases:
                emit({**row, "phase": "eval", **peer_eval(
                    torch, model, config, device, eval_batch, args.steps, args.repeats,
                    args.warmup)})
            if "generate" in args.phases:
                for batch in args.generate_batches:
                    emit({**row, "phase": "generate", **peer_generate(
                        torch, model, config, device, batch, args.tokens, args.repeats)})


# -- the parent: one child per framework and preset, the table ----------------------------------
def peer_available():
    import importlib.util
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))


def run_child(framework, presets, args, timeout):
    cmd = [sys.executable, "-m", "benchmarks.accelerator_bench", f"--one={framework}",
           f"--presets={','.join(presets)}", f"--dtypes={','.join(args.dtypes)}",
           f"--generate_batches={','.join(map(str, args.generate_batches))}",
           f"--phases={','.join(args.phases)}", f"--steps={args.steps}",
           f"--repeats={args.repeats}", f"--warmup={args.warmup}", f"--tokens={args.tokens}",
           f"--fp32_matmul={args.fp32_matmul}",
           f"--matmul_n={args.matmul_n}"] + (["--smoke"] if args.smoke else [])
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONUNBUFFERED="1")
    if args.smoke:  # compile time is most of a smoke run; XLA's -O0 halves it
        env.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
    env["PYTHONPATH"] = common.REPO + os.pathsep + env.get("PYTHONPATH", "")
    rows, error = [], None
    try:
        proc = subprocess.run(cmd, cwd=common.REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)
        stdout, stderr, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as expired:
        stdout = (expired.stdout or b"").decode() if isinstance(expired.stdout, bytes) else (
            expired.stdout or "")
        stderr, code = f"timed out after {timeout:.0f} s", "timeout"
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            rows.append(json.loads(line[len("RESULT "):]))
    if code != 0:
        error = f"{framework} {','.join(presets)}: exit {code}: {(stderr or '')[-2000:]}"
    return rows, error


def measure(args):
    frameworks = ["tfxl"]
    peer_note = None
    if args.peer == "on" or (args.peer == "auto" and peer_available()):
        frameworks.append("peer")
    elif args.peer == "auto":
        peer_note = "peer not run: torch and transformers are not installed (the bench extra)"
    out = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "smoke": args.smoke, "args": {k: v for k, v in vars(args).items() if k != "one"},
           "peer_note": peer_note, "rows": [], "errors": []}
    deadline = time.monotonic() + args.budget_s
    # One process per framework and preset (a JAX process keeps the accelerator memory it took);
    # a smoke run's presets share one (process starts are most of its time).
    groups = [args.presets] if args.smoke else [[preset] for preset in args.presets]
    for presets in groups:
        for framework in frameworks:
            left = deadline - time.monotonic()
            preset = ",".join(presets)
            if left < 10:
                out["errors"].append(f"{framework} {preset}: not run, --budget_s spent")
                continue
            start = time.perf_counter()
            rows, error = run_child(framework, presets, args, left)
            print(f"{framework} {preset}: {len(rows)} results in "
                  f"{time.perf_counter() - start:.0f} s" + (f"; {error}" if error else ""),
                  flush=True)
            out["rows"].extend(rows)
            if error:
                out["errors"].append(error)
            common.dump_json(args.out, out)
    return out


def _peak(rows, dtype):
    peaks = [r["flop_per_s"] for r in rows if r["phase"] == "matmul_peak" and r["dtype"] == dtype]
    return max(peaks) if peaks else None


def _rate(row, phase):
    if row is None:
        return None
    return 1e3 / row["ms_per_token"] if phase == "generate" else row["tokens_per_s"]


def table(out):
    """The Markdown table for BENCHMARKS.md: tfxl on JAX beside the peer, row by row."""
    rows = out["rows"]
    devices = sorted({f"{r['framework']}: {r['device']} ({r['backend']})" for r in rows})
    peaks = {d: _peak(rows, d) for d in DTYPES}
    lines = ["Device and software: " + "; ".join(devices) + ".",
             "Matmul peak (best of both frameworks, chained square matmuls): " + ", ".join(
                 f"{d} {p / 1e12:.4g} TFLOP/s" for d, p in peaks.items() if p) + ".", "",
             "| preset | measurement | B | T / M | dtype | tfxl (JAX) | HF PyTorch | "
             "tfxl ÷ HF speed | tfxl TFLOP/s (% of peak) | HF TFLOP/s (% of peak) |",
             "| --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"]

    def find(framework, preset, phase, dtype, batch):
        for r in rows:
            if (r["framework"], r["preset"], r["phase"], r["dtype"], r.get("batch")) == (
                    framework, preset, phase, dtype, batch):
                return r
        return None

    def flops(r, peak):
        if r is None or "flop_per_s" not in r:
            return "—"
        share = f" ({100 * r['flop_per_s'] / peak:.0f}%)" if peak else ""
        return f"{r['flop_per_s'] / 1e12:.3g}{share}"

    keys = []
    for r in rows:
        key = (r["preset"], r["phase"], r["dtype"], r.get("batch"))
        if r["phase"] != "matmul_peak" and key not in keys:
            keys.append(key)
    order = {p: i for i, p in enumerate(PHASES)}
    keys.sort(key=lambda k: (k[0], order[k[1]], k[3], k[2]))
    for preset, phase, dtype, batch in keys:
        mine, peer = (find(f, preset, phase, dtype, batch) for f in ("tfxl", "peer"))
        ref = mine or peer
        if phase == "generate":
            what, shape = "generation, ms/token", f"1 / {ref['mem_len']}"
            value = lambda r: f"{r['ms_per_token']:.2f}" if r else "—"
        else:
            what = "training, tokens/s" if phase == "train" else "evaluation, tokens/s"
            shape = f"{ref['tgt_len']} / {ref['mem_len']}"
            value = lambda r: f"{r['tokens_per_s']:,.0f}" if r else "—"
        ratio = (f"{_rate(mine, phase) / _rate(peer, phase):.2f}×" if mine and peer
                 and _rate(peer, phase) > 0 and _rate(mine, phase) > 0 else "—")
        peak = peaks.get(dtype)
        lines.append(f"| {preset} | {what} | {batch} | {shape} | {dtype} | {value(mine)} | "
                     f"{value(peer)} | {ratio} | {flops(mine, peak)} | {flops(peer, peak)} |")
    if any(r.get("tensorflow_loaded") for r in rows):
        lines.append("WARNING: TensorFlow was imported by a measuring process.")
    for note in [out.get("peer_note")] + out.get("errors", []):
        if note:
            lines.append(f"Not measured: {note.splitlines()[0]}")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="2-layer models, few steps: checks the harness runs (not a result)")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--steps", type=int, default=None,
                        help="steps (segments) per timed loop (default 10; --smoke 2)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed loops per measurement; the median is reported (default 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (default 2)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="generated tokens timed (default 64; --smoke 4)")
    parser.add_argument("--generate_batches", default=None,
                        help="generation batch sizes (default 1,32; --smoke 1)")
    parser.add_argument("--peer", choices=("auto", "on", "off"), default="auto",
                        help="the PyTorch peer: auto = where torch and transformers import")
    parser.add_argument("--fp32_matmul", choices=("tf32", "highest"), default="tf32",
                        help="fp32 matmuls on GPUs: TF32 on both frameworks, or full float32")
    parser.add_argument("--matmul_n", type=int, default=0,
                        help="size of the peak's square matmuls (0: 8192 on a GPU, else 2048)")
    parser.add_argument("--budget_s", type=float, default=3600,
                        help="stop starting measurements after this many seconds")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--one", choices=("tfxl", "peer"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.presets = [p for p in args.presets.split(",") if p]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.phases = [p for p in args.phases.split(",") if p]
    if args.generate_batches is None:
        args.generate_batches = "1" if args.smoke else ",".join(map(str, GENERATE_BATCHES))
    args.generate_batches = [int(b) for b in args.generate_batches.split(",") if b]
    for values, known, what in ((args.presets, PRESETS, "preset"), (args.dtypes, DTYPES, "dtype"),
                                (args.phases, PHASES, "phase")):
        unknown = sorted(set(values) - set(known))
        if unknown:
            parser.error(f"unknown {what}(s) {unknown}; choose from {list(known)}")
    defaults = (2, 2, 1, 4) if args.smoke else (10, 3, 2, 64)
    for name, default in zip(("steps", "repeats", "warmup", "tokens"), defaults):
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.one:
        (run_tfxl if args.one == "tfxl" else run_peer)(args)
        return None
    out = measure(args)
    title = "SMOKE RUN (2-layer models, a check that the harness runs; not a result)" if (
        args.smoke) else "Accelerator benchmark"
    print(f"\n{title}, {out['date']}\n")
    print(table(out))
    common.dump_json(args.out, out)
    if out["errors"] or not out["rows"]:
        raise SystemExit(1)
    return out


if __name__ == "__main__":
    main()
