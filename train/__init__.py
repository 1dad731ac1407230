"""Training and evaluation of tfxl models, Orbit-style: input_fn (tfxl.data) + trainer, evaluator
and controller (train/loop.py composes them)."""

# First, before any train module imports TensorFlow: tfxl-train, tfxl-eval and the demo silence
# its start-up chatter (tfxl/cli.py).
from tfxl import cli as _cli

_cli.quiet_tensorflow_if_command_line()
