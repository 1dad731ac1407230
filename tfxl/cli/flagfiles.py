"""--flagfile, read through tf.io.gfile.

absl reads --flagfile with open(), which cannot read a bucket. Every tool therefore expands its
flagfiles itself, before absl parses argv, through tf.io.gfile: all of them, local ones too, so
one rule and one error message hold wherever the file lies (and a local flagfile may name one in
a bucket). absl's rules otherwise: `--flagfile=PATH`, `--flagfile PATH` or one dash; in the file
one flag per line, blank lines and lines starting with `#` or `//` ignored, a line
`--flagfile=PATH` expanded in its place; an empty PATH is ignored; expansion stops at `--`.
Unlike absl (a warning, then the file skipped), a file that includes itself is an error.
"""

import io
import os

from tfxl.cli.errors import one_line

_FLAGFILE = ("--flagfile", "-flagfile")


def _flagfile_lines(path, including):
    if not path:
        return []
    if path in including:
        raise ValueError(f"--flagfile={path} includes itself "
                         f"({' -> '.join([*including, path])})")
    import tensorflow as tf  # the tool has loaded it by now
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            text = f.read().decode("utf-8")
    except (OSError, tf.errors.OpError, UnicodeDecodeError) as err:
        where = f" (included by {including[-1]})" if including else ""
        raise ValueError(f"--flagfile={path}{where}: cannot read ({one_line(err)})") from None
    lines = []
    # Lines as absl's readlines() of a text file gives them: universal newlines, each kept.
    for line in io.StringIO(text, newline=None).readlines():
        if line.isspace() or line.startswith(("#", "//")):
            continue
        if line.startswith(tuple(f"{name}=" for name in _FLAGFILE)):
            nested = os.path.expanduser(line.partition("=")[2].strip())
            lines += _flagfile_lines(nested, [*including, path])
        else:
            lines.append(line.strip())
    return lines


def expand_flagfiles(argv):
    """argv (program name first) with every flagfile directive replaced by its file's flags,
    read through tf.io.gfile (see above); ValueError naming a file that cannot be read."""
    expanded, rest = [argv[0]], list(argv[1:])
    while rest:
        arg = rest.pop(0)
        if arg in _FLAGFILE:
            if not rest:
                raise ValueError(f"{arg} needs a file name")
            expanded += _flagfile_lines(os.path.expanduser(rest.pop(0)), [])
        elif arg.startswith(tuple(f"{name}=" for name in _FLAGFILE)):
            expanded += _flagfile_lines(os.path.expanduser(arg.partition("=")[2].strip()), [])
        else:
            expanded.append(arg)
            if arg == "--":
                return expanded + rest
    return expanded
