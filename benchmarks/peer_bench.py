"""Benchmark peer: a PyTorch Transformer-XL measured in the same run as tfxl.

Every "vs peer" ratio of the harness divides a tfxl figure by this peer, measured in the same
`benchmarks.run`: Hugging Face transformers' `TransfoXLLMHeadModel` (4.46; the widely used port of
the original PyTorch code) on torch 2.13 CPU, eager, float32, with the shape of tfxl's `bench`
config (`common.BENCH`: 4 layers, D 512, 8x64 heads, d_inner 2048, bytes vocab 258, plain softmax,
tied weights) and as many threads as TensorFlow gets.

  * training: global batch 16, T = M = 128, Adam (lr 2.5e-4), global-norm clip 0.25, dropout 0.1,
    the memory returned by each step fed to the next; the loss covers all T targets of a segment,
    as in tfxl (HF's `labels=` path shifts inside the segment and scores T - 1 of them);
  * evaluation: `model.eval()` under `torch.no_grad()`, batch 16, memory carried, at (T 128, M 128)
    and (T 80, M 512), same_length False and no clamp (tfxl's bench eval path).

Token ids are random bytes: with a plain softmax the speed does not depend on them. Untimed warm-up
steps, then the best of `loops` timed loops. Each measurement runs in a fresh subprocess that never
imports TensorFlow (both runtimes size their own thread pools to the cores).

    python -m benchmarks.peer_bench [--quick] [--json F] [--intra_op N] [--inter_op N]

Needs the `bench` extra: pip install .[bench]  (torch==2.13.0, transformers>=4.46,<4.47).
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common

PEER = "HF transformers 4.46 TransfoXLLMHeadModel, torch 2.13 CPU, same config/threads"
EVAL_SETTINGS = ((128, 128), (80, 512))  # (T, M), as eval_bench's throughput part


def require():
    """Raises a clear error if the peer's packages are missing (checked without importing them)."""
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"the PyTorch peer needs {' and '.join(missing)}: pip install .[bench]")


# -- in the child process ----------------------------------------------------------------------
def patch_type_as(torch):
    """transformers 4.46's TransfoXLModel.forward calls `arange(...).type_as(dtype=...)`, which no
    torch accepts (huggingface/transformers#29650); run it as the `.to(dtype)` it means."""
    if getattr(torch.Tensor.type_as, "_tfxl_shim", False):
        return
    type_as = torch.Tensor.type_as

    def shim(t, other=None, dtype=None):
        return t.to(dtype) if dtype is not None else type_as(t, other)
    shim._tfxl_shim = True
    torch.Tensor.type_as = shim


def build_peer(mem_len):
    """torch with TensorFlow's thread count, and the HF model with the bench config's shape."""
    os.environ["USE_TF"] = "0"  # else transformers imports TensorFlow, installed beside it
    import torch
    import transformers
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    patch_type_as(torch)
    torch.set_num_threads(common._THREADS["intra_op"] or os.cpu_count())
    if common._THREADS["inter_op"]:
        torch.set_num_interop_threads(common._THREADS["inter_op"])
    transformers.logging.set_verbosity_error()  # the deprecated-model / GenerationMixin notices
    torch.manual_seed(0)
    b = common.BENCH
    config = TransfoXLConfig(
        vocab_size=b["vocab_size"], n_layer=b["n_layer"], d_model=b["d_model"],
        d_embed=b["d_model"], n_head=b["n_head"], d_head=b["d_head"], d_inner=b["d_inner"],
        cutoffs=[], adaptive=False, div_val=1, tie_word_embeddings=True,  # plain tied softmax
        dropout=b["dropout"], dropatt=b["dropatt"], mem_len=mem_len,
        # tfxl's TransfoXLConfig defaults, which the bench config keeps:
        clamp_len=-1, same_length=False, untie_r=False, pre_lnorm=False, init_std=0.02,
        proj_init_std=0.01, layer_norm_epsilon=1e-5)
    model = TransfoXLLMHeadModel(config)
    return torch, model


def _segments(torch, batch, tgt_len, count):
    """`count` consecutive (inputs, targets) segments of one random byte stream per batch row."""
    ids = torch.randint(0, 256, (batch, count * tgt_len + 1))
    return [(ids[:, i * tgt_len:(i + 1) * tgt_len], ids[:, i * tgt_len + 1:(i + 1) * tgt_len + 1])
            for i in range(count)]


def _nll(torch, log_probs, targets, reduction):
    return torch.nn.functional.nll_loss(log_probs.reshape(-1, log_probs.size(-1)),
                                        targets.reshape(-1), reduction=reduction)


def _info(torch, model):
    import transformers
    return {"peer": PEER, "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
            "parameters": sum(p.numel() for p in model.parameters())}


def time_loops(step, steps, loops, warmup):
    """Runs `warmup` untimed steps, then `loops` loops of `steps`; (best s, best CPU s, foreign)."""
    for _ in range(warmup):
        step()
    best = best_cpu = float("inf")
    snap = common.cpu_snapshot()
    for _ in range(loops):
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(steps):
            step()
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, time.process_time() - cpu_start)
    return best, best_cpu, common.foreign_cpu_share(snap, common.cpu_snapshot())


def run_train(batch, tgt_len, mem_len, steps, loops, warmup):
    torch, model = build_peer(mem_len)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=2.5e-4)
    segments = _segments(torch, batch, tgt_len, warmup + steps * loops)
    state = {"step": 0, "mems": None, "loss": None}

    def step():
        inputs, targets = segments[state["step"]]
        out = model(input_ids=inputs, mems=state["mems"])
        loss = _nll(torch, out.prediction_scores, targets, "mean")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        state.update(step=state["step"] + 1, mems=out.mems, loss=loss.item())

    best, best_cpu, foreign = time_loops(step, steps, loops, warmup)
    return {**_info(torch, model), "batch": batch, "tgt_len": tgt_len, "mem_len": mem_len,
            "steps_per_loop": steps, "step_s": best / steps, "cpu_s_per_step": best_cpu / steps,
            "tokens_per_s": steps * batch * tgt_len / best, "final_loss": state["loss"],
            "peak_rss_mib": common.peak_rss_mib(), "foreign_cpu": foreign}


def run_eval(batch, tgt_len, mem_len, steps, loops, warmup):
    torch, model = build_peer(mem_len)
    model.eval()  # no dropout
    segments = _segments(torch, batch, tgt_len, warmup + steps * loops)
    state = {"step": 0, "mems": None, "nll": 0.0}

    def step():
        inputs, targets = segments[state["step"]]
        out = model(input_ids=inputs, mems=state["mems"])
        nll = _nll(torch, out.prediction_scores, targets, "sum").item()
        state.update(step=state["step"] + 1, mems=out.mems, nll=state["nll"] + nll)

    with torch.no_grad():
        best, best_cpu, foreign = time_loops(step, steps, loops, warmup)
    return {**_info(torch, model), "batch": batch, "tgt_len": tgt_len, "mem_len": mem_len,
            "segments_per_loop": steps, "segment_s": best / steps,
            "cpu_s_per_segment": best_cpu / steps, "tokens_per_s": steps * batch * tgt_len / best,
            "peak_rss_mib": common.peak_rss_mib(), "foreign_cpu": foreign}


# -- in the parent: one fresh subprocess per measurement ----------------------------------------
def run_subprocess(part, batch, tgt_len, mem_len, steps, loops, warmup):
    require()
    cmd = [sys.executable, "-m", "benchmarks.peer_bench", f"--one={part}", f"--batch={batch}",
           f"--tgt_len={tgt_len}", f"--mem_len={mem_len}", f"--steps={steps}", f"--loops={loops}",
           f"--warmup={warmup}", *common.thread_args()]
    proc = subprocess.run(cmd, cwd=common.REPO, capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"peer_bench child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def measure_peer_train(batch=16, tgt_len=128, mem_len=128, steps=None, loops=None, quick=False):
    """Training tokens/s of the peer (dict with tokens_per_s, step_s, ...)."""
    steps = steps or (2 if quick else 4)
    loops = loops or (2 if quick else 3)
    return run_subprocess("train", batch, tgt_len, mem_len, steps, loops, 1 if quick else 2)


def measure_peer_eval(settings=EVAL_SETTINGS, batch=16, steps=None, loops=None, quick=False):
    """Evaluation tokens/s of the peer per (T, M) setting (list of dicts with tokens_per_s, ...)."""
    steps = steps or (4 if quick else 8)
    loops = loops or (2 if quick else 3)
    return [run_subprocess("eval", batch, tgt_len, mem_len, steps, loops, 1)
            for tgt_len, mem_len in settings]


def measure(quick=False):
    """Both parts, as `benchmarks.run` stores them: {"train": dict, "eval": [dict, ...]}."""
    return {"train": measure_peer_train(quick=quick), "eval": measure_peer_eval(quick=quick)}


def eval_row(peer, tgt_len, mem_len):
    """The peer's evaluation result at (T, M), or None if it was not measured there."""
    rows = [r for r in (peer or {}).get("eval", [])
            if (r["tgt_len"], r["mem_len"]) == (tgt_len, mem_len)]
    return rows[0] if rows else None


def ratio(tokens_per_s, peer_row):
    return f"{tokens_per_s / peer_row['tokens_per_s']:.2f}×" if peer_row else "—"


def table(peer):
    rows = ["| measurement | T | M | tokens/s | s per segment | other tenants' CPU |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    t = peer["train"]
    rows.append(f"| training (dropout 0.1, Adam, clip 0.25) | {t['tgt_len']} | {t['mem_len']} | "
                f"{t['tokens_per_s']:,.0f} | {t['step_s']:.3f} | {100 * t['foreign_cpu']:.0f}% |")
    for r in peer["eval"]:
        rows.append(f"| evaluation (no_grad) | {r['tgt_len']} | {r['mem_len']} | "
                    f"{r['tokens_per_s']:,.0f} | {r['segment_s']:.3f} | "
                    f"{100 * r['foreign_cpu']:.0f}% |")
    return "\n".join(rows)


def main(argv=None):
    parser = common.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--one", choices=("train", "eval"), help=argparse.SUPPRESS)
    for name, default in (("batch", 16), ("tgt_len", 128), ("mem_len", 128), ("steps", 4),
                          ("loops", 3), ("warmup", 2)):
        parser.add_argument(f"--{name}", type=int, default=default, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # Not common.setup(): that imports TensorFlow.
    common._THREADS.update(intra_op=args.intra_op, inter_op=args.inter_op)
    if args.one:
        run = run_train if args.one == "train" else run_eval
        result = run(args.batch, args.tgt_len, args.mem_len, args.steps, args.loops, args.warmup)
        print("RESULT " + json.dumps(result))
        return result
    peer = measure(quick=args.quick)
    print(f"{PEER}; {peer['train']['threads']} threads, {peer['train']['parameters']:,} "
          f"parameters")
    print(table(peer))
    common.dump_json(args.json, peer)
    return peer


if __name__ == "__main__":
    main()
