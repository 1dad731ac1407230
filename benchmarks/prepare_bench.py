"""Benchmark: `tfxl-prepare` on a 100 MB corpus (enwik8 size) in bounded memory.

Generates a synthetic 100 MB text corpus (a Zipf-distributed word salad with
some multi-byte UTF-8, so it is neither trivially compressible nor ASCII-only)
in a temporary directory, runs `python -m tfxl.data.prepare` in a subprocess
(enwik8-style single-file split, byte tokenizer, T=512, S=16 unless told
otherwise) and prints throughput in MB/s of input and the child's peak RSS
(`resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`).

    python benchmarks/prepare_bench.py [--mb 100] [--tokenizer bytes] [--tgt_len 512]

Not a timed test; numbers go to BENCHMARKS.md.
"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_corpus(path: str, megabytes: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(30000)] + ["über", "naïve", "café", "Straße", "日本"]
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    target = megabytes * 1_000_000
    written = 0
    with open(path, "wb") as f:
        while written < target:
            picks = rng.choice(len(words), size=200_000, p=weights)
            lengths = rng.integers(5, 25, size=20_000)
            pieces, start = [], 0
            for n in lengths:
                pieces.append(" ".join(words[i] for i in picks[start:start + n]))
                start += n
                if start >= picks.size:
                    break
            block = ("\n".join(pieces) + "\n").encode("utf-8")
            block = block[:target - written]
            f.write(block)
            written += len(block)
    return written


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--tokenizer", default="bytes")
    parser.add_argument("--tgt_len", type=int, default=512)
    parser.add_argument("--num_streams", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tfxl-bench-") as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        size = write_corpus(corpus, args.mb)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                   PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, "-m", "tfxl.data.prepare", f"--train={corpus}",
               f"--output_dir={os.path.join(tmp, 'out')}", f"--tokenizer={args.tokenizer}",
               f"--tgt_len={args.tgt_len}", f"--num_streams={args.num_streams}"]
        start = time.time()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        seconds = time.time() - start
        if proc.returncode:
            sys.exit(f"prepare failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
        out_bytes = sum(os.path.getsize(os.path.join(tmp, "out", f))
                        for f in os.listdir(os.path.join(tmp, "out")))
    print(f"input:        {size / 1e6:.1f} MB ({args.tokenizer}, tgt_len={args.tgt_len}, "
          f"num_streams={args.num_streams})")
    print(f"wall time:    {seconds:.1f} s (including interpreter and TensorFlow start-up)")
    print(f"throughput:   {size / 1e6 / seconds:.2f} MB/s")
    print(f"peak RSS:     {peak_kib / 1024:.0f} MiB (child process)")
    print(f"output:       {out_bytes / 1e6:.1f} MB of TFRecords + manifest")


if __name__ == "__main__":
    main()
