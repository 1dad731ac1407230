"""The one exception type for bad checkpoints / bad conversion input.

`ConversionError` subclasses `ValueError`; its message is a single line so that `tfxl-convert`
can print it as one ``error: ...`` line. A long list (every tensor that does not match) is
summarised there and kept whole in `details`, which `tfxl-convert --verbosity=1` prints.
"""


class ConversionError(ValueError):
    """A checkpoint that cannot be read or does not match the model configuration.

    details: lines that the one-line message summarises (empty when it says everything)."""

    def __init__(self, message, details=()):
        super().__init__(message)
        self.details = list(details)
