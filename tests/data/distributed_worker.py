"""Runs input_fn under a 2-replica MirroredStrategy on two logical CPUs.

Used by test_distributed.py in a subprocess, because logical devices must be
configured before TensorFlow initialises its devices.  Usage:

    python distributed_worker.py DATA_DIR GLOBAL_BATCH OUT.npz

For each method (experimental_distribute_dataset, distribute_datasets_from_function)
and mode (train: 40 steps, valid: one full pass) it saves, per replica, the
stacked `stream`, `position`, `reset`, `targets`, `target_mask` arrays.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)

from tfxl.data.pipeline import InputParams, input_fn


def main(data_dir, global_batch, out_path):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    keys = ("stream", "position", "reset", "targets", "target_mask")
    results = {}
    for split, training, steps in (("train", True, 40), ("valid", False, None)):
        params = InputParams(data_dir=data_dir, batch_size=global_batch, training=training)
        datasets = {
            "experimental": strategy.experimental_distribute_dataset(input_fn(split, params)),
            "from_function": strategy.distribute_datasets_from_function(
                lambda ctx, p=params, s=split: input_fn(s, p, ctx)),
        }
        for method, dist in datasets.items():
            per_replica = {(r, k): [] for r in range(2) for k in keys}
            for step, batch in enumerate(dist):
                if steps is not None and step >= steps:
                    break
                for k in keys:
                    for r, value in enumerate(strategy.experimental_local_results(batch[k])):
                        per_replica[(r, k)].append(value.numpy())
            for (r, k), values in per_replica.items():
                results[f"{method}/{split}/{r}/{k}"] = np.stack(values)
    np.savez(out_path, **results)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
