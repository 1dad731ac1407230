"""The one runner of every command-line tool: tfxl-prepare, -train, -eval, -export, -generate,
-convert and `python -m train.demo`.

* A usage error (unknown flag, bad flag value, stray argument) prints one `error: ...` line and
  exits 2, as does every error a user can cause (ValueError, OSError, TensorFlow's OpError, and
  the tool's own `errors`); nothing else differs between tools.
* `--help` (-h, -?, --helpshort) prints the tool's docstring and its own flags with their help.
  absl's lists only the flags of `__main__`, which for a console script is the generated wrapper.
* Quiet by default: TensorFlow's C++ log lines (start-up "oneDNN"/"cuda" notices, "E0000 ..."
  kernel notes) and its Python INFO logs (the saver's "Sharding callback") are hidden.
  `--verbosity=1` shows them all again; an explicit TF_CPP_MIN_LOG_LEVEL is honoured.

TensorFlow prints its start-up lines while it loads, through C++ logging that ignores
TF_CPP_MIN_LOG_LEVEL before absl::InitializeLog (never called). So the quieting has to be in place
before TensorFlow is imported, and must filter file descriptor 2: `tfxl/__init__.py` calls
`quiet_tensorflow_if_command_line()` first thing, which is why this module imports no TensorFlow.
"""

import atexit
import logging
import os
import re
import signal
import sys
import time

# Tool name -> its module (what `python -m` runs).
TOOLS = {"tfxl-prepare": "tfxl.data.prepare", "tfxl-train": "train.main",
         "tfxl-eval": "train.evaluate", "tfxl-export": "tfxl.serving.export_main",
         "tfxl-generate": "tfxl.serving.generate_main", "tfxl-convert": "tfxl.convert.main",
         "python -m train.demo": "train.demo"}
HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "-helpshort")

# absl's C++ log line as TensorFlow writes it (no InitializeLog: the time is printed as 0000
# 00:00:<epoch>), e.g. "E0000 00:00:1795380158.120568   32054 cuda_platform.cc:52] ...".
_NATIVE_LINE = re.compile(rb"^([IWE])0000 00:00:\d+\.\d+ +\d+ \S+:\d+\] ")
_NATIVE_BANNER = b"WARNING: All log messages before absl::InitializeLog() is called"
# The second line of cpu_feature_guard's INFO message ("This TensorFlow binary is optimized ...").
_NATIVE_CONTINUATION = re.compile(rb"^To enable the following instructions: .* rebuild "
                                  rb"TensorFlow with the appropriate compiler flags\.$")
_NATIVE_LEVEL = {b"I": 0, b"W": 1, b"E": 2}
_quieted = False


def is_command_line():
    """True when this process is one of TOOLS (console script or `python -m`)."""
    if os.path.basename(sys.argv[0]) in TOOLS:
        return True
    argv = getattr(sys, "orig_argv", [])
    return any(a == "-m" and b in TOOLS.values() for a, b in zip(argv, argv[1:]))


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


def quiet_tensorflow_if_command_line():
    if is_command_line():
        quiet_tensorflow()


def quiet_tensorflow(argv=None):
    """Hides TensorFlow's logs below TF_CPP_MIN_LOG_LEVEL (default 3) unless --verbosity >= 1."""
    global _quieted
    if _quieted:
        return
    _quieted = True
    verbosity = requested_verbosity(sys.argv if argv is None else argv)
    if verbosity is not None and verbosity >= 1:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    # TF logs through absl too. (absl.logging first: it must create the "absl" logger itself.)
    from absl import logging as absl_logging  # pylint: disable=import-outside-toplevel
    absl_logging.get_absl_logger().addFilter(_hide_tensorflow_info)
    try:
        min_level = int(os.environ["TF_CPP_MIN_LOG_LEVEL"])
    except ValueError:
        min_level = 3
    # Only before TensorFlow loads (no fork once its threads run; its start-up lines are out).
    if min_level > 0 and "tensorflow" not in sys.modules:
        _filter_native_logs(min_level)


def _hide_tensorflow_info(record):
    """False for INFO records logged by TensorFlow's own modules (the saver's "Sharding
    callback" at every checkpoint); the tool's own INFO logs (training progress) stay."""
    return record.levelno >= logging.WARNING or _TENSORFLOW_DIR not in record.pathname


_TENSORFLOW_DIR = f"{os.sep}tensorflow{os.sep}"


def _filter_native_logs(min_level):
    """Routes file descriptor 2 through a child process that drops native log lines below
    min_level. A process, not a thread: it outlives a crash of this one (abort, segfault), so
    a fatal message still reaches the terminal. Forked before TensorFlow starts any thread."""
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


def one_line(text):
    return " ".join(str(text).split())


def fail(message):
    """Prints the one `error:` line of a usage or user error; returns exit status 2."""
    print(f"error: {one_line(message)}", file=sys.stderr)
    return 2


def _user_errors(extra):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (loaded by now)
    return (ValueError, OSError, tf.errors.OpError, *extra)


def _print_help(doc):
    from absl import flags  # pylint: disable=import-outside-toplevel
    print((doc or f"{os.path.basename(sys.argv[0])} [flags]").strip() + "\n")
    print("flags:\n" + flags.FLAGS.module_help(sys.argv[0]))
    print("\nTry --helpfull to get a list of all flags (absl's and TensorFlow's too).")


def run(main, define_flags=None, errors=()):
    """Runs absl `main(argv) -> exit status` as a command-line tool (see the module docstring).

    define_flags: registers the tool's flags; they are the ones --help lists.
    errors: exception types, besides ValueError/OSError/OpError, that are the user's fault.
    """
    from absl import app, flags  # pylint: disable=import-outside-toplevel
    quiet_tensorflow()
    before = set(flags.FLAGS)
    if define_flags is not None:
        define_flags()
    for name in sorted(set(flags.FLAGS) - before):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
    doc = sys.modules[main.__module__].__doc__

    def parse_flags(argv):
        if any(arg in HELP_FLAGS for arg in argv[1:]):
            _print_help(doc)
            sys.exit(0)
        try:
            return flags.FLAGS(argv)
        except flags.Error as err:
            sys.exit(fail(err))

    def main_or_error_line(argv):
        if len(argv) > 1:
            return fail(f"unexpected arguments: {' '.join(argv[1:])}")
        try:
            return main(argv)
        except app.UsageError as err:
            return fail(err)
        except Exception as err:  # pylint: disable=broad-except
            if isinstance(err, _user_errors(errors)):
                return fail(err)
            raise

    app.run(main_or_error_line, flags_parser=parse_flags)
