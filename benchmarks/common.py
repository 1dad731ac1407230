"""Shared pieces of the benchmark harness: thread settings, machine facts, configs, FLOP counts,
the measured matmul peak and generated data prepared with `tfxl-prepare`.

Shape glossary: B batch, T segment length, M memory length, K = M + T keys, L layers, D model
size, N heads, H head size, F d_inner, V vocabulary size.

Import this module (and call `setup()`) before anything touches TensorFlow's runtime: thread
settings only take effect before the first op.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

_THREADS = {"intra_op": 0, "inter_op": 0}


def add_common_args(parser: argparse.ArgumentParser):
    parser.add_argument("--intra_op", type=int, default=0,
                        help="tf intra-op threads (0 = TensorFlow's default: one per core)")
    parser.add_argument("--inter_op", type=int, default=0,
                        help="tf inter-op threads (0 = TensorFlow's default)")
    parser.add_argument("--quick", action="store_true", help="fewer steps / sizes")
    parser.add_argument("--json", default=None, help="also write the results as JSON here")
    return parser


def setup(args=None):
    """Applies thread settings (before the first TF op) and returns the tf module."""
    import tensorflow as tf
    if args is not None:
        _THREADS.update(intra_op=args.intra_op, inter_op=args.inter_op)
    tf.config.threading.set_intra_op_parallelism_threads(_THREADS["intra_op"])
    tf.config.threading.set_inter_op_parallelism_threads(_THREADS["inter_op"])
    return tf


def thread_args():
    """Command-line flags that give a child benchmark process the same thread settings."""
    return [f"--intra_op={_THREADS['intra_op']}", f"--inter_op={_THREADS['inter_op']}"]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    keep = [f for f in flags if f in ("avx2", "fma", "avx512f", "avx512_bf16",
                                                      "avx512_vnni", "amx_bf16", "amx_tile")]
                    return " ".join(keep)
    except OSError:
        pass
    return ""


def machine_info() -> dict:
    import keras
    import tensorflow as tf
    intra, inter = _THREADS["intra_op"], _THREADS["inter_op"]
    cores = os.cpu_count()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{cpu_model()}, {cores} logical CPUs ({cpu_flags()}), "
                   f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "intra_op_threads": f"{intra} ({'TF default = ' + str(cores) if intra == 0 else 'set'})",
        "inter_op_threads": f"{inter} ({'TF default = ' + str(cores) if inter == 0 else 'set'})",
        # TensorFlow's own default: oneDNN on only where the CPU has AVX-512 (the tools set 1
        # unless exported: tfxl/cli/cpu.py; the harness does not, so its runs are comparable).
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default (%s)" % (
            "on: AVX-512" if "avx512f" in cpu_flags() else "off: no AVX-512")),
    }


def cpu_snapshot():
    """(busy jiffies of the whole VM, all jiffies, CPU seconds of this process and its children)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    process_cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return sum(fields) - idle, sum(fields), process_cpu


def foreign_cpu_share(before, after):
    """Share of the machine's CPU time used by other processes between two snapshots (0..1).

    Other sessions share this VM (their processes are invisible to `ps` but not to /proc/stat);
    when this is high, timings are pessimistic.
    """
    hz = os.sysconf("SC_CLK_TCK")
    busy = (after[0] - before[0]) / hz
    total = (after[1] - before[1]) / hz
    mine = after[2] - before[2]
    return max(0.0, min(1.0, (busy - mine) / total)) if total > 0 else 0.0


def peak_rss_mib() -> float:
    """This process's peak RSS as the plan reads it (`tfxl.host`, which imports neither
    TensorFlow nor Keras, so the PyTorch peer's process may read it too)."""
    from tfxl.host import resident_bytes
    return resident_bytes() / 2**20


# -- configs ----------------------------------------------------------------------------------
BYTES_VOCAB = 258  # tfxl-prepare's bytes tokenizer: 256 bytes + <pad> + <eod>


# The issue's `bench` model: 4 layers, D 512, 8x64 heads, F 2048, T = M = 128, bytes. A plain dict
# so that the PyTorch peer (benchmarks/peer_bench.py) reads the same shape without importing tfxl,
# which would load TensorFlow into its process.
BENCH = dict(vocab_size=BYTES_VOCAB, n_layer=4, d_model=512, n_head=8, d_head=64, d_inner=2048,
             dropout=0.1, dropatt=0.0, tgt_len=128, mem_len=128)


def bench_config(**overrides):
    from tfxl.config import TransfoXLConfig
    return TransfoXLConfig(**{**BENCH, **overrides})


def tiny_config(**overrides):
    from tfxl.config import get_preset
    return get_preset("tiny", vocab_size=BYTES_VOCAB, **overrides)


CONFIGS = {"bench": bench_config, "tiny": tiny_config}


# -- FLOP counts (a multiply-add = 2 FLOPs) ----------------------------------------------------
def forward_flops(c, batch, seg_len, mem_len, key_value_memory=False):
    """FLOPs of one forward pass over a [batch, seg_len] segment with mem_len memory slots.

    Counted as the implementation computes them: q on the T segment rows only; k and v on all
    K = M + T rows and the position projection W_k,R R once per layer (batch independent) on the
    layer-input memory, or k and v on the T new rows only and no W_k,R R (computed once per pass)
    with `key_value_memory`; AC, BD
    (dense over all K columns before rel_shift) and probs x V, each 2 B N T K H; output projection;
    the two FFN matmuls; the softmax logits (plain softmax: 2 B T D V; the adaptive tail clusters
    are counted as if every token hit them, an upper bound). Elementwise work (LayerNorm, softmax
    normalisation, masks) is not counted: it is a few per cent at these sizes.
    """
    b, t, k = batch, seg_len, mem_len + seg_len
    d, nh, f = c.d_model, c.n_head * c.d_head, c.d_inner
    projected = t if key_value_memory else k
    per_layer = (2 * b * t * d * nh          # q
                 + 2 * 2 * b * projected * d * nh               # k, v
                 + (0 if key_value_memory else 2 * k * d * nh)  # W_k,R R
                 + 3 * 2 * b * c.n_head * t * k * c.d_head  # AC, BD, AV
                 + 2 * b * t * nh * d        # output projection
                 + 2 * 2 * b * t * d * f)    # FFN
    softmax = 2 * b * t * d * c.vocab_size
    if c.embed_dim != d or c.cutoffs:
        softmax = 2 * b * t * (d * c.embed_dim + c.embed_dim * c.vocab_size)
    return c.n_layer * per_layer + softmax


def train_flops(c, batch):
    """One training step: forward + backward (backward ~ 2x forward, the usual estimate)."""
    return 3 * forward_flops(c, batch, c.tgt_len, c.mem_len)


# -- the matmul peak ---------------------------------------------------------------------------
def matmul_peak(dtype="float32", n=2048, seconds=3.0):
    """Best achieved FLOP/s of an [n, n] x [n, n] tf.matmul in `dtype` (8 chained per call)."""
    import tensorflow as tf
    a = tf.random.normal((n, n), dtype=tf.float32)
    a = tf.cast(a, dtype) * tf.cast(0.02, dtype)
    b = tf.cast(tf.random.normal((n, n)), dtype)
    reps = 8

    @tf.function
    def run(x):
        acc = x
        for _ in range(reps):
            acc = tf.matmul(acc, b)
        return acc

    run(a).numpy()  # trace + warm-up
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        run(a).numpy()
        elapsed = time.perf_counter() - start
        best = max(best, reps * 2 * n ** 3 / elapsed)
    return best


# -- data ----------------------------------------------------------------------------------------
def write_text(path, megabytes, seed=0):
    """A generated text corpus (the data engineer's Zipf word salad from prepare_bench.py)."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from prepare_bench import write_corpus
    return write_corpus(path, megabytes, seed)


def prepare_data(tmp_dir, tgt_len, megabytes=2, num_streams=16):
    """Runs `tfxl-prepare` (bytes tokenizer) on a generated corpus; returns the data_dir."""
    corpus = os.path.join(tmp_dir, "corpus.txt")
    if not os.path.exists(corpus):
        write_text(corpus, megabytes)
    out = os.path.join(tmp_dir, f"data_t{tgt_len}")
    if os.path.exists(os.path.join(out, "manifest.json")):
        return out
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "tfxl.data.prepare", f"--train={corpus}", f"--output_dir={out}",
           "--tokenizer=bytes", f"--tgt_len={tgt_len}", f"--num_streams={num_streams}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"tfxl-prepare failed:\n{proc.stderr[-2000:]}")
    return out


def temp_dir(prefix="tfxl-bench-"):
    return tempfile.TemporaryDirectory(prefix=prefix)


def dump_json(path, payload):
    if path:
        with open(path, "w") as f:
            json.dump(payload, f, indent=2, default=str)


def fmt(x, digits=0):
    if x is None:
        return "—"
    return f"{x:,.{digits}f}"
