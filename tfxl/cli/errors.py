"""The one `error:` line a tool prints for what its user caused (the one place it is made)."""

import re
import sys
import traceback

# TensorFlow prefixes an op's error with the function it ran in, e.g. "{{function_node
# __wrapped__IteratorGetNext_output_types_1_device_/job:localhost/...}} ": internals, not news.
_FUNCTION_NODE = re.compile(r"\{\{function_node [^}]*\}\}\s*")


def one_line(text):
    return " ".join(str(text).split())


def fail(message, show_traceback=False):
    """Prints the one `error:` line of a usage or user error; returns exit status 2.
    show_traceback: the exception being handled is printed first (--verbosity=1)."""
    if show_traceback:
        traceback.print_exc(file=sys.stderr)
    print(f"error: {_FUNCTION_NODE.sub('', one_line(message))}", file=sys.stderr)
    return 2
