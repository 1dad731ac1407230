"""The one runner of every command-line tool: tfxl-prepare, -train, -eval, -export, -generate,
-convert and `python -m tfxl.train.demo`.

* A usage error (unknown flag, bad flag value, stray argument) prints one `error: ...` line and
  exits 2, as does every error a user can cause (ValueError, OSError, TensorFlow's OpError, and
  the tool's own `errors`); nothing else differs between tools.
* `--flagfile=PATH` may lie in a bucket (gs://...): the runner expands flagfiles itself through
  tf.io.gfile before absl parses the flags (`expand_flagfiles`).
* `--help` (-h, -?, --helpshort) prints the tool's docstring and its own flags with their help.
  absl's lists only the flags of `__main__`, which for a console script is the generated wrapper.
* Quiet by default: TensorFlow's C++ log lines (start-up "oneDNN"/"cuda" notices, "E0000 ..."
  kernel notes), its Python INFO logs (the saver's "Sharding callback") and its tf.function
  retracing hint (the tools trace one step per evaluation setting on purpose) are hidden.
  `--verbosity=1` shows them all again; an explicit TF_CPP_MIN_LOG_LEVEL is honoured.

TensorFlow prints its start-up lines while it loads, through C++ logging that ignores
TF_CPP_MIN_LOG_LEVEL before absl::InitializeLog (never called). So the quieting has to be in place
before TensorFlow is imported, and must filter file descriptor 2: `tfxl/__init__.py` calls
`quiet_tensorflow_if_command_line()` first thing, which is why this module imports no TensorFlow.
"""

import atexit
import dataclasses
import io
import logging
import os
import re
import signal
import sys
import time
import typing

# The model's description (no TensorFlow in it, unlike the rest of tfxl).
from tfxl.config import EVAL_SETTINGS, PRESETS, TransfoXLConfig

# TensorFlow and absl are imported inside the functions that use them: `import tfxl` runs this
# module before anything else, and the quieting must be in place first (see above).

# Tool name -> its module (what `python -m` runs).
TOOLS = {"tfxl-prepare": "tfxl.data.prepare", "tfxl-train": "tfxl.train.main",
         "tfxl-eval": "tfxl.train.evaluate", "tfxl-export": "tfxl.serving.export_main",
         "tfxl-generate": "tfxl.serving.generate_main", "tfxl-convert": "tfxl.convert.main",
         "python -m tfxl.train.demo": "tfxl.train.demo"}
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


def _hide_tensorflow_chatter(record):
    """False for INFO records logged by TensorFlow's own modules (the saver's "Sharding
    callback" at every checkpoint) and for its tf.function retracing hint: the tools trace one
    step per evaluation setting on purpose (tfxl-eval, the demo's memory lengths), which is what
    the hint counts. The tool's own logs (training progress) stay."""
    if _TENSORFLOW_DIR not in record.pathname:
        return True
    return (record.levelno >= logging.WARNING
            and "triggered tf.function retracing" not in record.getMessage())


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
    import tensorflow as tf  # the tool has loaded it by now: this only looks it up
    return (ValueError, OSError, tf.errors.OpError, *extra)


# ------------------------------------------------------------------------------ flagfiles
# absl reads --flagfile with open(), which cannot read a bucket. Every tool therefore expands its
# flagfiles itself, before absl parses argv, through tf.io.gfile: all of them, local ones too,
# so one rule and one error message hold wherever the file lies (and a local flagfile may name
# one in a bucket). absl's rules otherwise: `--flagfile=PATH`, `--flagfile PATH` or one dash;
# in the file one flag per line, blank lines and lines starting with `#` or `//` ignored, a line
# `--flagfile=PATH` expanded in its place; an empty PATH is ignored; expansion stops at `--`.
# Unlike absl (a warning, then the file skipped), a file that includes itself is an error.
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


def _print_help(doc):
    from absl import flags
    print((doc or f"{os.path.basename(sys.argv[0])} [flags]").strip() + "\n")
    print("flags:\n" + flags.FLAGS.module_help(sys.argv[0]))
    print("\nTry --helpfull to get a list of all flags (absl's and TensorFlow's too).")


def run(main, define_flags=None, errors=(), failures=None):
    """Runs absl `main(argv) -> exit status` as a command-line tool (see the module docstring).

    define_flags: registers the tool's flags; they are the ones --help lists.
    errors: exception types, besides ValueError/OSError/OpError, that are the user's fault.
    failures: {exception type: exit status} for failures that are not (tfxl-train: a diverged
      run exits 3).
    """
    from absl import app, flags
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
            return flags.FLAGS(expand_flagfiles(argv))
        except (flags.Error, ValueError) as err:
            sys.exit(fail(err))

    def main_or_error_line(argv):
        return exit_status(main, argv, errors, failures)

    app.run(main_or_error_line, flags_parser=parse_flags)


def exit_status(main, argv, errors=(), failures=None):
    """Runs `main(argv)` once the flags are parsed: its exit status, or 2 with one `error:` line
    for a stray argument or an error the user caused (see `run`); `failures` maps other
    exception types to their own status (one `error:` line too)."""
    from absl import app
    if len(argv) > 1:
        return fail(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        return main(argv)
    except app.UsageError as err:
        return fail(err)
    except Exception as err:  # sorted below by type; anything else is re-raised
        for kind, status in (failures or {}).items():
            if isinstance(err, kind):
                fail(err)
                return status
        if isinstance(err, _user_errors(errors)):
            return fail(err)
        raise


# ------------------------------------------------------------------------------ model flags
# Every tool that builds a model from flags (tfxl-train, tfxl-convert) describes it the same way:
#   1. --preset's fields,
#   2. the tool's own defaults (tfxl-convert: the TF1 LayerNorm epsilon),
#   3. the fields in the --config JSON file (a whole TransfoXLConfig, e.g. a model_dir's
#      config.json, or only some fields),
#   4. the tool's own sources (tfxl-convert: the --hf_config translation),
#   5. the override flags, one per TransfoXLConfig field (--n_layer, --cutoffs, ...),
#   6. what the tool sets itself (tfxl-train: vocab_size from the data; it has no flag there),
# later ones winning. --config is layered on --preset, not instead of it: every flag a user
# gives counts, the same way for every tool.


def _field_help():
    """{field: help} from the `Attributes:` section of TransfoXLConfig's docstring."""
    doc = TransfoXLConfig.__doc__.split("Attributes:", 1)[1]
    helps, name = {}, None
    for line in doc.splitlines():
        match = re.match(r"^ {6}(\w+): (.*)$", line)
        if match:
            name, text = match.groups()
            helps[name] = text
        elif name and line.strip():
            helps[name] += " " + line.strip()
    return helps


def config_fields(exclude=()):
    """[(name, kind, help)] for the TransfoXLConfig fields that get a flag: kind is int, float,
    bool, "ints" or "bools" (comma-separated lists), read from the field's type annotation."""
    hints, helps = typing.get_type_hints(TransfoXLConfig), _field_help()
    fields = []
    for field in dataclasses.fields(TransfoXLConfig):
        if field.name in exclude:
            continue
        kind = hints[field.name]
        if typing.get_origin(kind) is typing.Union:  # Optional[X]: the flag's None is "keep"
            kind = next(k for k in typing.get_args(kind) if k is not type(None))
        if typing.get_origin(kind) is tuple:
            kind = {int: "ints", bool: "bools"}[typing.get_args(kind)[0]]
        if field.name not in helps:
            raise TypeError(f"TransfoXLConfig.{field.name} has no line in its Attributes")
        fields.append((field.name, kind, helps[field.name]))
    return fields


def define_config_flags(preset_default=None, exclude=(), config_help="", flag_values=None):
    """Defines --preset, --config and one override flag per TransfoXLConfig field (except
    `exclude`: the fields the tool sets itself), registered as the calling module's flags."""
    from absl import flags
    module = sys._getframe(1).f_globals["__name__"]
    where = dict(module_name=module, flag_values=flags.FLAGS if flag_values is None
                 else flag_values)
    flags.DEFINE_enum("preset", preset_default, sorted(PRESETS),
                      "Base model hyper-parameters: one of the paper's settings (tfxl.PRESETS).",
                      **where)
    flags.DEFINE_string("config", None, "JSON file of TransfoXLConfig fields (all or some, e.g. "
                        "a model_dir's config.json), layered on --preset." + config_help,
                        **where)
    for name, kind, help_ in config_fields(exclude):
        help_ = f"Model: {help_} (default: --preset/--config's)"
        if kind is int:
            flags.DEFINE_integer(name, None, help_, **where)
        elif kind is float:
            flags.DEFINE_float(name, None, help_, **where)
        elif kind is bool:
            flags.DEFINE_bool(name, None, help_, **where)
        else:
            flags.DEFINE_list(name, None, help_ + " Comma-separated "
                              f"{'integers' if kind == 'ints' else 'true/false'}.", **where)


def _list_value(name, kind, values):
    items = [v.strip() for v in values if v.strip()]
    if kind == "ints":
        try:
            return tuple(int(v) for v in items)
        except ValueError:
            raise ValueError(f"--{name}: not integers: {','.join(values)}") from None
    truth = {"1": True, "true": True, "t": True, "yes": True, "y": True,
             "0": False, "false": False, "f": False, "no": False, "n": False}
    bad = [v for v in items if v.lower() not in truth]
    if bad:
        raise ValueError(f"--{name}: {bad[0]!r} is not true/false")
    return tuple(truth[v.lower()] for v in items)


def resolve_config(flag_values=None, defaults=None, sources=(), fixed=None):
    """The TransfoXLConfig the flags of `define_config_flags` describe (the rule above).

    defaults: {field: value}, the tool's own defaults (over --preset, under everything else).
    sources: [(what, {field: value})], the tool's own sources between --config and the flags.
    fixed: {field: value} the tool sets itself, over everything.
    A tie_projs not given by --config or --tie_projs is dropped when it does not fit the cutoffs
    (a preset's was written for the preset's cutoffs). Raises ValueError naming the sources.
    """
    from absl import flags
    from tfxl.files import read_json
    fv = flags.FLAGS if flag_values is None else flag_values
    known = {f.name for f in dataclasses.fields(TransfoXLConfig)}
    fields, layers = {}, []
    if fv.preset:
        fields.update(PRESETS[fv.preset])
        layers.append(f"--preset={fv.preset}")
    fields.update(defaults or {})
    pinned = set()  # fields given by --config or a flag
    if fv.config:
        data = read_json(fv.config, "--config")
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"--config {fv.config}: unknown TransfoXLConfig field(s) {unknown}")
        fields.update(data)
        pinned |= set(data)
        layers.append(f"--config={fv.config}")
    for what, values in sources:
        fields.update(values)
        layers.append(what)
    given = []
    for name, kind, _ in config_fields():
        if name in fv and fv[name].value is not None:
            value = fv[name].value
            fields[name] = _list_value(name, kind, value) if kind in ("ints", "bools") else value
            pinned.add(name)
            given.append(f"--{name}")
    if given:
        layers.append(" ".join(given))
    fields.update(fixed or {})
    if ("tie_projs" not in pinned and fields.get("tie_projs") is not None
            and len(fields["tie_projs"]) != len(tuple(fields.get("cutoffs", ()))) + 1):
        fields["tie_projs"] = None
    try:
        return TransfoXLConfig.from_dict(fields)
    except ValueError as err:
        raise ValueError(f"{err} (model from "
                         f"{', '.join(layers) or 'the TransfoXLConfig defaults'})") from None


def define_eval_flags(names=EVAL_SETTINGS, note="", flag_values=None):
    """Flags overriding the evaluation settings (TransfoXLConfig.eval_settings resolves them),
    registered as the calling module's flags."""
    from absl import flags
    module = sys._getframe(1).f_globals["__name__"]
    where = dict(module_name=module, flag_values=flags.FLAGS if flag_values is None
                 else flag_values)
    what = {"tgt_len": "Segment length T", "mem_len": "Memory length M",
            "clamp_len": "Clamp relative distances at this (-1: no clamp)",
            "same_length": "Every query attends to the same number of keys"}
    for name in names:
        help_ = f"{what[name]} (default: the config's eval_{name}, else its {name}){note}."
        define = flags.DEFINE_bool if name == "same_length" else flags.DEFINE_integer
        define(name, None, help_, **where)


def eval_overrides(names=EVAL_SETTINGS, flag_values=None):
    """{setting: flag value} for TransfoXLConfig.eval_settings (None: the config's)."""
    from absl import flags
    fv = flags.FLAGS if flag_values is None else flag_values
    return {name: fv[name].value for name in names if name in fv}
