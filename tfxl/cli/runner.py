"""The one runner of every command-line tool: tfxl-prepare, -prepare-classification, -train,
-eval, -classify-eval, -export, -generate, -convert and `python -m tfxl.train.demo`.

* A usage error (unknown flag, bad flag value, stray argument) prints one `error: ...` line and
  exits 2, as does every error a user can cause (ValueError, OSError, TensorFlow's OpError, and
  the tool's own `errors`); nothing else differs between tools. With `--verbosity=1` the
  traceback behind the line is printed before it.
* `--flagfile=PATH` may lie in a bucket (gs://...): the runner expands flagfiles itself through
  tf.io.gfile before absl parses the flags (tfxl/cli/flagfiles.py).
* `--help` (-h, -?, --helpshort) prints the tool's docstring and its own flags in groups
  (tfxl/cli/tool_help.py).
* TensorFlow is quiet (tfxl/cli/quiet.py); the tool's entry point made it so before TensorFlow
  loaded, `run` once more for a tool started otherwise (a test calling it).
"""

import sys

from absl import app, flags

from tfxl.cli.errors import fail
from tfxl.cli.flagfiles import expand_flagfiles
from tfxl.cli.quiet import quiet_tensorflow
from tfxl.cli.tool_help import tool_help

HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "-helpshort")


def run(main, define_flags=None, errors=(), failures=None, help_groups=()):
    """Runs absl `main(argv) -> exit status` as a command-line tool (see the module docstring).

    define_flags: registers the tool's flags; they are the ones --help lists.
    errors: exception types, besides ValueError/OSError/OpError, that are the user's fault.
    failures: {exception type: exit status} for failures that are not (tfxl-train: a diverged
      run exits 3), or a function returning it, called only when main raised (its types may
      live in modules that load TensorFlow, which --help does not).
    help_groups: [(heading, flag names)]: how --help groups the tool's flags.
    """
    quiet_tensorflow()
    before = set(flags.FLAGS)
    if define_flags is not None:
        define_flags()
    own = list(dict.fromkeys(name for name in flags.FLAGS if name not in before))
    for name in own:
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
    doc = sys.modules[main.__module__].__doc__

    def parse_flags(argv):
        if any(arg in HELP_FLAGS for arg in argv[1:]):
            print(tool_help(doc, flags.FLAGS, own, help_groups))
            sys.exit(0)
        try:
            return flags.FLAGS(expand_flagfiles(argv))
        except (flags.Error, ValueError) as err:
            sys.exit(fail(err))

    def main_or_error_line(argv):
        return exit_status(main, argv, errors, failures)

    app.run(main_or_error_line, flags_parser=parse_flags)


def _user_errors(extra):
    import tensorflow as tf  # the tool has loaded it by now: this only looks it up
    return (ValueError, OSError, tf.errors.OpError, *extra)


def _verbose():
    return flags.FLAGS.is_parsed() and "verbosity" in flags.FLAGS and flags.FLAGS.verbosity >= 1


def exit_status(main, argv, errors=(), failures=None):
    """Runs `main(argv)` once the flags are parsed: its exit status, or 2 with one `error:` line
    for a stray argument or an error the user caused (see `run`); `failures` maps other
    exception types to their own status (one `error:` line too). With --verbosity=1 the
    traceback comes before the line."""
    if len(argv) > 1:
        return fail(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        return main(argv)
    except app.UsageError as err:
        return fail(err)
    except Exception as err:  # sorted below by type; anything else is re-raised
        if callable(failures):
            failures = failures()
        for kind, status in (failures or {}).items():
            if isinstance(err, kind):
                fail(err, show_traceback=_verbose())
                return status
        if isinstance(err, _user_errors(errors)):
            return fail(err, show_traceback=_verbose())
        raise


def note(message):
    """A tool's note on what it does (resumed from, warm start, a lease taken over): one plain
    line on stderr, beside the `error:` lines, leaving stdout to progress and results. Not
    absl's logging, whose lines carry a date, thread and source file."""
    print(message, file=sys.stderr, flush=True)


def print_result(result, output=None):
    """An evaluation tool's result: one JSON line on stdout (the only thing there) and, with
    `output` (its --output, checked writable before the work), the same JSON written whole."""
    import json

    from tfxl.files import write_json_atomically  # TensorFlow: not at this package's import
    print(json.dumps(result, sort_keys=True))
    if output:
        write_json_atomically(output, result)
