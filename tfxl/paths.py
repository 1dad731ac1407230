"""Where a path lies, without TensorFlow: `tfxl.files` (TensorFlow's file systems) and the
keras-hub presets (`tfxl.hub.presets`, which import TensorFlow only for a bucket) ask it."""

import os
import re

# TensorFlow's own URI rule (tsl::io::ParseURI): a scheme is a letter, then letters, digits and
# dots, followed by "://".
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9.]*)://")


def is_local(path):
    """Whether `path` lies on the local file system: no scheme, or file://. Any other scheme is
    an object store to tfxl (no atomic directory rename)."""
    match = _SCHEME.match(os.fspath(path))
    return match is None or match.group(1).lower() == "file"
