"""Training and evaluation of tfxl models, Orbit-style: input_fn (tfxl.data) + trainer, evaluator
and controller (train/loop.py composes them)."""
