"""What a model_dir holds besides checkpoints: the model it was made for and the training log.

A model_dir is claimed (config.json and data.json written) only once every check of a first run
has passed, so a run refused for a bad flag leaves nothing that would refuse the corrected command.
"""

import json
import os

import tensorflow as tf

from tfxl.config import TransfoXLConfig
from tfxl.data.fingerprint import check_data_fingerprint
from tfxl.files import write_json_atomically, write_text_atomically

TRAIN_LOG = "train_log.jsonl"
METRICS = "metrics.json"


def check_or_store_config(model_dir, config, store=True):
    """Refuses a model_dir trained with another model; `store` writes config.json into a new one.

    The trainer checks early (store=False) and stores only once every other check has passed
    (`claim`).
    """
    path = os.path.join(model_dir, "config.json")
    if tf.io.gfile.exists(model_dir) and not tf.io.gfile.isdir(model_dir):
        raise ValueError(f"--model_dir={model_dir} is a file, not a directory")
    if tf.io.gfile.exists(path):
        stored = TransfoXLConfig.from_file(path).to_dict()
        wanted = config.to_dict()
        diff = {k: (stored.get(k), wanted.get(k)) for k in sorted(set(stored) | set(wanted))
                if stored.get(k) != wanted.get(k)}
        if diff:
            listing = ", ".join(f"{k}: model_dir has {a!r}, flags give {b!r}"
                                for k, (a, b) in diff.items())
            raise ValueError(f"--model_dir={model_dir} holds a different model ({listing}); "
                             "use a new --model_dir or the same model flags")
    elif store:
        tf.io.gfile.makedirs(model_dir)
        write_json_atomically(path, config.to_dict())


def claim(model_dir, config, manifest, data_dir):
    """Writes config.json and data.json (or checks them): every other check has passed."""
    check_or_store_config(model_dir, config)
    check_data_fingerprint(model_dir, manifest, data_dir, store=True)


def truncate_log(path, last_step):
    """Drops log lines after `last_step` (steps a killed run did after its last checkpoint)."""
    if not tf.io.gfile.exists(path):
        return
    with tf.io.gfile.GFile(path) as f:
        kept = [line for line in f if line.strip() and json.loads(line)["step"] <= last_step]
    write_text_atomically(path, "".join(kept))
