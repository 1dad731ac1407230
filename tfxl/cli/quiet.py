"""Quiet command-line tools: TensorFlow's C++ log lines (start-up "oneDNN"/"cuda" notices,
"E0000 ..." kernel notes), its Python INFO logs (the saver's "Sharding callback") and its
tf.function retracing hint (the tools trace one step per evaluation setting on purpose) are
hidden. `--verbosity=1` shows them all again; an explicit TF_CPP_MIN_LOG_LEVEL is honoured.

TensorFlow prints its start-up lines while it loads, through C++ logging that ignores
TF_CPP_MIN_LOG_LEVEL before absl::InitializeLog (never called). So `quiet_tensorflow` must run
before TensorFlow is imported, and filters file descriptor 2 through a child process. Only a
tool calls it, first thing: its console script (tfxl/cli/scripts.py) or, under `python -m`, the
tool module's first lines. Importing tfxl never does. This module imports no TensorFlow.
"""

import atexit
import logging
import os
import re
import signal
import sys
import time

from tfxl.cli.cpu import prefer_onednn

# absl's C++ log line as TensorFlow writes it (no InitializeLog: the time is printed as 0000
# 00:00:<epoch>), e.g. "E0000 00:00:1795380158.120568   32054 cuda_platform.cc:52] ...".
_NATIVE_LINE = re.compile(rb"^([IWE])0000 00:00:\d+\.\d+ +\d+ \S+:\d+\] ")
_NATIVE_BANNER = b"WARNING: All log messages before absl::InitializeLog() is called"
# The second line of cpu_feature_guard's INFO message ("This TensorFlow binary is optimized ...").
_NATIVE_CONTINUATION = re.compile(rb"^To enable the following instructions: .* rebuild "
                                  rb"TensorFlow with the appropriate compiler flags\.$")
_NATIVE_LEVEL = {b"I": 0, b"W": 1, b"E": 2}
_TENSORFLOW_DIR = f"{os.sep}tensorflow{os.sep}"
_quieted = False
_stderr_was_a_terminal = None  # what fd 2 was before the filter replaced it by a pipe


def requested_verbosity(argv):
    """The value of --verbosity/-v on the command line (absl's flag), or None."""
    for i, arg in enumerate(argv[1:], 1):
        if arg == "--":
            break
        name, has_value, value = arg.lstrip("-").partition("=")
        if arg.startswith("-") and name in ("v", "verbosity"):
            value = value if has_value else (argv[i + 1] if i + 1 < len(argv) else "")
            try:
                return int(value)
            except ValueError:
                return None
    return None


def quiet_tensorflow(argv=None):
    """Hides TensorFlow's logs below TF_CPP_MIN_LOG_LEVEL (default 3) unless --verbosity >= 1
    (in `argv`, default sys.argv), and asks for oneDNN's kernels unless the environment says
    (`tfxl.cli.cpu.prefer_onednn`). Once per process; the native filter only before TensorFlow
    is imported."""
    global _quieted
    if _quieted:
        return
    _quieted = True
    # The tools' other setting that must precede TensorFlow's import (tfxl/cli/cpu.py): every
    # tool calls this first, so it is made here once for all of them, whatever the verbosity.
    prefer_onednn()
    verbosity = requested_verbosity(sys.argv if argv is None else argv)
    if verbosity is not None and verbosity >= 1:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    logging.getLogger("tensorflow").addFilter(_hide_tensorflow_chatter)
    # TF logs through absl too. (absl.logging first: it must create the "absl" logger itself.)
    from absl import logging as absl_logging
    absl_logging.get_absl_logger().addFilter(_hide_tensorflow_chatter)
    try:
        min_level = int(os.environ["TF_CPP_MIN_LOG_LEVEL"])
    except ValueError:
        min_level = 3
    # Only before TensorFlow loads (no fork once its threads run; its start-up lines are out).
    if min_level > 0 and "tensorflow" not in sys.modules:
        _filter_native_logs(min_level)


def stream_is_terminal(stream):
    """Whether `stream` shows on a terminal: for stderr under the native-log filter, whether the
    real stderr behind the filter's pipe is one."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.StringIO, a closed stream: no fd
        return bool(getattr(stream, "isatty", lambda: False)())
    if fd == 2 and _stderr_was_a_terminal is not None:
        return _stderr_was_a_terminal
    return os.isatty(fd)


def _hide_tensorflow_chatter(record):
    """False for INFO records logged by TensorFlow's own modules (the saver's "Sharding
    callback" at every checkpoint) and for its tf.function retracing hint: the tools trace one
    step per evaluation setting on purpose (tfxl-eval, the demo's memory lengths), which is what
    the hint counts. The tool's own logs (training progress) stay."""
    if _TENSORFLOW_DIR not in record.pathname:
        return True
    return (record.levelno >= logging.WARNING
            and "triggered tf.function retracing" not in record.getMessage())


def hide_native_logs(min_level=3):
    """Drops TensorFlow's native log lines below `min_level` (3: I, W and E lines, and absl's
    "before InitializeLog" banner) from file descriptor 2, for a process that is not a tool and
    imports TensorFlow: the test suite's processes (tests/conftest.py). Before TensorFlow is
    imported only (none once it is). Everything else on stderr passes: Python's tracebacks, a
    fatal (F) line."""
    if "tensorflow" not in sys.modules:
        _filter_native_logs(min_level)


def _filter_native_logs(min_level):
    """Routes file descriptor 2 through a child process that drops native log lines below
    min_level. A process, not a thread: it outlives a crash of this one (abort, segfault), so
    a fatal message still reaches the terminal. Forked before TensorFlow starts any thread."""
    global _stderr_was_a_terminal
    try:
        real_stderr = os.dup(2)
        read_end, write_end = os.pipe()
        child = os.fork()
    except OSError:
        return  # no stderr to filter, or no fork: TensorFlow's lines stay
    if child == 0:  # the filter: reads until every writer is gone, then exits
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the tool, not for us
        os.close(write_end)
        _pump(read_end, real_stderr, min_level)
        os._exit(0)
    os.close(read_end)
    _stderr_was_a_terminal = os.isatty(real_stderr)
    os.dup2(write_end, 2)
    os.close(write_end)

    def stop():
        sys.stderr.flush()
        os.dup2(real_stderr, 2)  # closes the pipe's last writer: the filter reads to the end
        for _ in range(500):  # then waits for it (at most 5 s: another process may hold it)
            if os.waitpid(child, os.WNOHANG)[0]:
                break
            time.sleep(0.01)

    atexit.register(stop)


def _hidden(line, min_level):
    if line.startswith(_NATIVE_BANNER) or _NATIVE_CONTINUATION.match(line):
        return min_level >= 1
    match = _NATIVE_LINE.match(line)
    return bool(match) and _NATIVE_LEVEL[match.group(1)] < min_level


def _pump(read_end, real_stderr, min_level):
    pending = b""
    try:
        while True:
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            shown = b"".join(line + b"\n" for line in lines if not _hidden(line, min_level))
            # A partial line goes out at once (prompts, progress) unless it may become a log line.
            if pending[:1] not in (b"I", b"W", b"E"):
                shown, pending = shown + pending, b""
            _write_all(real_stderr, shown)
        if not _hidden(pending, min_level):
            _write_all(real_stderr, pending)
    except OSError:  # the terminal went away: keep reading so that writers never block
        while os.read(read_end, 1 << 16):
            pass


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]
