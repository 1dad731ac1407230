"""keras-hub presets in a bucket (gs://...).

keras-hub writes a preset with os.makedirs and open() (its KerasPresetSaver) while Keras writes
the weights through tf.io.gfile, so `save_to_preset("gs://b/p")` would put the weights in the
bucket and the configs in a local folder named "gs:/b/p". tfxl's preset classes save a remote
preset into a local temporary directory with keras-hub's own code and upload that tree
(`tfxl.files.StagedDirectory`), the `config.json` that keras-hub's loader looks for first
uploaded last: a preset whose upload has not finished (or failed) is refused by `from_preset`
instead of loaded half-written. Saving over an existing preset replaces its files, as keras-hub
does locally; a save that writes a new config.json removes the old one first, so no reader
combines the old preset's files with the new one's.

Loading needs nothing of tfxl: keras-hub's `from_preset` reads a preset under any scheme
TensorFlow's file system knows (gs://, ...) file by file into its cache ($KERAS_HOME/models or
~/.keras/models) and reuses the cached files after that.
"""

import os

from tfxl.backend import require_tensorflow
from tfxl.files import StagedDirectory, is_local
from tfxl.private_apis import CONFIG_FILE


def save_preset(save, preset_dir, **kwargs):
    """`save(preset_dir, **kwargs)` (a keras-hub `save_to_preset`), for a local directory or a
    bucket (see the module docstring)."""
    preset_dir = os.fspath(preset_dir)
    if is_local(preset_dir):
        return save(preset_dir, **kwargs)
    # A bucket is TensorFlow's file system (tf.io.gfile): imported only for one.
    require_tensorflow(f"saving a keras-hub preset to {preset_dir}")
    # Only a save that writes config.json (a backbone's, a task's) replaces it: a tokenizer or
    # preprocessor saved into an existing preset leaves the preset's config.json alone.
    with StagedDirectory(preset_dir, "preset", scratch="tfxl-preset-", local=False) as staged:
        save(staged.path, **kwargs)
        staged.publish(last=(CONFIG_FILE,), replace=True)
    return None
