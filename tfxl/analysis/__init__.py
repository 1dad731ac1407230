"""How much context a language model uses: its loss by context length (`context_losses`) and the
Relative Effective Context Length of a group of models (`recl`, Dai et al., 2019, Appendix C)."""

from tfxl.analysis.recl import RelativeGains, recl, relative_gains

__all__ = ["RelativeGains", "context_losses", "recl", "relative_gains", "target_positions"]


def __getattr__(name):  # the model is imported only by what reads with one
    if name in ("context_losses", "target_positions"):
        from tfxl.analysis import context
        return getattr(context, name)
    raise AttributeError(f"module 'tfxl.analysis' has no attribute {name!r}")
