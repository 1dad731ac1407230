"""A/B of `sample_next`, for BENCHMARKS.md "Sampler": before (TensorFlow's top_k and
stateless_categorical) and after (keras.ops, Gumbel-max over the counter hash), at wt103's
vocabulary, in tf.function with and without XLA, interleaved, best of 5 runs of 20 calls.

    python benchmarks/sampler_ab.py OLD_SAMPLING_PY   # sampling.py of a commit before 6cdb4c9
"""

import importlib.util
import sys
import time

import tensorflow as tf

import tfxl.models.sampling as new

V = 267735  # wt103's vocabulary


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(old_path):
    old = load(old_path, "old_sampling")
    seed = tf.constant([1, 0])
    for batch in (1, 32):
        log_probs = tf.nn.log_softmax(tf.random.stateless_normal((batch, V), (1, 2)) * 3)
        for jit in (False, True):
            fns = {name: tf.function(lambda lp, s, m=m: m.sample_next(lp, 0.8, 40, 0.95, s),
                                     jit_compile=jit)
                   for name, m in (("before", old), ("after", new))}
            for f in fns.values():
                f(log_probs, seed)
            best = {name: float("inf") for name in fns}
            for _ in range(5):
                for name, f in fns.items():
                    start = time.perf_counter()
                    for _ in range(20):
                        out = f(log_probs, seed)
                    out.numpy()
                    best[name] = min(best[name], (time.perf_counter() - start) / 20)
            print(f"B={batch} xla={jit}: before {best['before'] * 1e3:.2f} ms, "
                  f"after {best['after'] * 1e3:.2f} ms per call")


if __name__ == "__main__":
    main(sys.argv[1])
