"""The one exception type for bad user input in the data package.

`DataError` subclasses `ValueError` so callers that already catch `ValueError`
(the trainer's flag checks, `check_manifest`) keep working, while
`tfxl-prepare` can tell a user mistake (print one ``error: ...`` line, exit 2)
apart from a bug (let the traceback through).
"""


class DataError(ValueError):
    """Bad input: a missing/unreadable file, bad flag, corrupt shard, ..."""
