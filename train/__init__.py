"""TPU-Estimator-style training of tfxl models: input_fn (tfxl.data) + model_fn + host loops."""

# First, before any train module imports TensorFlow: tfxl-train, tfxl-eval and the demo silence
# its start-up chatter (tfxl/cli.py).
from tfxl import cli as _cli

_cli.quiet_tensorflow_if_command_line()
