"""Every private API of TensorFlow and keras-hub that tfxl uses, each where no public one does
the same, with the reason, and every private method of theirs that a tfxl class overrides
(`PRIVATE_OVERRIDES`). Everything else in tfxl uses public APIs only; a name here moving in a new
release fails tests/test_private_apis.py, which names it.

    from tfxl.private_apis import checkpoint_management

Each name is imported when first used (PEP 562), so that importing one (a keras-hub helper)
imports nothing of the others (TensorFlow's internals).
"""

import importlib

# name -> (module, attribute (None: the module itself), why no public API serves).
PRIVATE_APIS = {
    "checkpoint_management": (
        "tensorflow.python.checkpoint.checkpoint_management", None,
        "CheckpointState parses a `checkpoint` state file so that the reason it is unusable can "
        "be told, and update_checkpoint_state_internal rewrites it with relative paths as "
        "tf.train.CheckpointManager writes it; tf.train.get_checkpoint_state hides the reason "
        "and tf.compat.v1.train.update_checkpoint_state writes absolute paths"),
    "device_lib": (
        "tensorflow.python.client.device_lib", None,
        "list_local_devices gives each GPU's allocator memory limit; tf.config reports only "
        "the memory in use (get_memory_info)"),
    "CONFIG_FILE": (
        "keras_hub.src.utils.preset_utils", "CONFIG_FILE",
        "the name of a keras-hub preset's config file, which a preset saved to a bucket "
        "copies last; keras_hub exports no name for it"),
    **{name: ("keras_hub.src.utils.tensor_utils", name,
              "keras-hub's own tokenizers handle their inputs (tf.data tensors on the CPU, "
              "Python strings and lists, ragged batches) with it; keras_hub.tokenizers does not "
              "export it")
       for name in ("preprocessing_function", "canonicalize_python_string_inputs",
                    "canonicalize_python_token_inputs", "convert_to_ragged_batch",
                    "restore_outer_shape")},
}

# Private methods of TensorFlow, Keras and keras-hub classes that a tfxl class overrides (a
# method or attribute of its own under a name the third-party class already has): name ->
# (module, class that defines it, why no public API serves). Not importable from here: nothing is
# read, the name is defined. tests/test_private_apis.py finds every override and fails on one not
# listed here.
PRIVATE_OVERRIDES = {
    "_all_reduce_sum_gradients": (
        "keras.src.backend.tensorflow.optimizer", "TFOptimizer",
        "the one place Keras' TensorFlow optimizers sum the gradients over the replicas inside "
        "apply; train/loop/optimization.py's optimizers take gradients the trainer has "
        "already summed (global-norm clipping needs the summed gradient's norm) and pass them "
        "through, so they are not summed twice; no public optimizer option skips that sum"),
}

__all__ = sorted(PRIVATE_APIS)


def __getattr__(name):
    if name not in PRIVATE_APIS:
        raise AttributeError(f"module 'tfxl.private_apis' has no attribute {name!r}")
    module_name, attribute, _ = PRIVATE_APIS[name]
    value = importlib.import_module(module_name)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value  # once
    return value
