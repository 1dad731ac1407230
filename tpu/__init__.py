"""Resolving the tf.distribute strategy a job runs under (TPU, Mirrored, MultiWorkerMirrored)."""

from tfxl.tpu.strategy import (STRATEGIES, StrategyError, define_flags, resolve_strategy,
                          strategy_from_flags)

__all__ = ["STRATEGIES", "StrategyError", "define_flags", "resolve_strategy", "strategy_from_flags"]
