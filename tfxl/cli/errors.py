"""The one `error:` line a tool prints for what its user caused (the one place it is made)."""

import re
import sys
import traceback

# TensorFlow prefixes an op's error with the function it ran in, e.g. "{{function_node
# __wrapped__IteratorGetNext_output_types_1_device_/job:localhost/...}} ": internals, not news.
_FUNCTION_NODE = re.compile(r"\{\{function_node [^}]*\}\}\s*")
# An error raised inside a tf.function: "Graph execution error:", then where the failing node
# was defined (a Python stack, indented lines), then the op's own message.
_GRAPH_ERROR = "Graph execution error:"
_DETECTED_AT = re.compile(r"^Detected at node .* defined at \(most recent call last\):$")
# The op's name and node list TensorFlow appends: "\t [[{{node X}}]]", " [Op:ReduceDataset] name: ".
_NODE_LIST = re.compile(r"\s*\[\[\{\{node [^}]*\}\}\]\]")
_OP_SUFFIX = re.compile(r"\s*\[Op:[^\]]*\](\s*name:\s*\S*)?\s*$")


def one_line(text):
    return " ".join(str(text).split())


def op_message(text):
    """A TensorFlow error's own message: without the Python stack of the node that failed inside
    a tf.function, the node list, the op's name and the function node prefix."""
    lines = str(text).splitlines()
    if lines and lines[0].strip() == _GRAPH_ERROR:
        lines = lines[1:]
        while lines and not lines[0].strip():
            lines = lines[1:]
        if lines and _DETECTED_AT.match(lines[0].strip()):
            lines = lines[1:]
            while lines and (not lines[0].strip() or lines[0][:1].isspace()):
                lines = lines[1:]
    text = _NODE_LIST.sub("", "\n".join(lines))
    return _OP_SUFFIX.sub("", _FUNCTION_NODE.sub("", text))


def fail(message, show_traceback=False):
    """Prints the one `error:` line of a usage or user error; returns exit status 2.
    show_traceback: the exception being handled is printed first (--verbosity=1)."""
    if show_traceback:
        traceback.print_exc(file=sys.stderr)
    print(f"error: {one_line(op_message(message))}", file=sys.stderr)
    return 2
