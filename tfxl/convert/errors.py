"""The one exception type for bad checkpoints / bad conversion input.

`ConversionError` subclasses `ValueError`; its message is a single line so that `tfxl-convert`
can print it as one ``error: ...`` line.
"""


class ConversionError(ValueError):
    """A checkpoint that cannot be read or does not match the model configuration."""
