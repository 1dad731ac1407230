"""Tiny models for tests: one base configuration, each test overriding what it depends on.

The base is small enough that every test runs in seconds, with an `init_std` large enough that
attention is neither uniform nor one-hot (so a wrong mask or position term shows in the outputs).
"""

import weakref

import pytest

from tfxl import TransfoXLConfig, TransfoXLLM

TINY = dict(vocab_size=23, n_layer=2, d_model=16, n_head=2, d_head=6, d_inner=24, dropout=0.0,
            dropatt=0.0, tgt_len=4, mem_len=4, init_std=0.2)


def tiny_config(**overrides):
    """A `TransfoXLConfig` of the tiny base with `overrides` (any config field) applied."""
    return TransfoXLConfig(**{**TINY, **overrides})


def tiny_lm(**overrides):
    """A built `TransfoXLLM` of `tiny_config(**overrides)`."""
    lm = TransfoXLLM(tiny_config(**overrides))
    lm.build((None, lm.config.tgt_len))
    return lm


def slices(tensors):
    """`tf.data.Dataset.from_tensor_slices(tensors)` with tfxl's pipeline options: no tf.data
    autotuning thread, whose exit TensorFlow 2.21 can miss when an iterator is deleted (a stall
    of up to 60 s; `tfxl.data.pipeline.pipeline_options`). Keras' fit and evaluate delete an
    iterator at every epoch and validation pass."""
    import tensorflow as tf
    from tfxl.data.pipeline import pipeline_options
    return tf.data.Dataset.from_tensor_slices(tensors).with_options(pipeline_options())


def adaptive_config(**overrides):
    """`tiny_config` with the optional parts on: adaptive input and softmax with projected tail
    clusters (div_val 2), one r bias pair per layer, a memory shorter than the segment."""
    return tiny_config(**{**dict(vocab_size=40, d_head=8, d_inner=32, d_embed=16,
                                 cutoffs=(10, 25), div_val=2, untie_r=True, tgt_len=6, mem_len=5,
                                 init_std=0.1), **overrides})


def random_bytes_data(root, tgt_len, num_streams, train_bytes=20000):
    """A tfxl-prepare data dir under `root` of random bytes from "abcdefgh" (train, valid, test):
    the trainer tests' data, where only its shape matters. Returns its path."""
    import numpy as np
    from tfxl.data.prepare import PrepareConfig, prepare
    rng = np.random.default_rng(0)
    for split, size in (("train", train_bytes), ("valid", 2000), ("test", 2000)):
        (root / f"{split}.txt").write_bytes(rng.choice(np.frombuffer(b"abcdefgh", np.uint8),
                                                       size).tobytes())
    out = root / "data"
    prepare(PrepareConfig(output_dir=str(out), train=[str(root / "train.txt")],
                          valid=[str(root / "valid.txt")], test=[str(root / "test.txt")],
                          tokenizer="bytes", tgt_len=tgt_len, num_streams=num_streams),
            log=lambda *a: None)
    return str(out)


# A tfxl-train that, inside the save of one checkpoint, marks a file and waits to be killed:
# `python -c HANG_IN_SAVE module function checkpoint marker <tfxl-train flags>` (kill -9 tests).
HANG_IN_SAVE = """
import importlib, sys, time
module_name, function_name, checkpoint, marker = sys.argv[1:5]
module = importlib.import_module(module_name)
original = getattr(module, function_name)

def hang(*args, **kwargs):  # inside the save of `checkpoint`: say so, then wait for the kill
    if checkpoint in repr(args) + repr(kwargs):
        open(marker, "w").close()
        time.sleep(600)
    return original(*args, **kwargs)

setattr(module, function_name, hang)
sys.argv = ["tfxl-train"] + sys.argv[5:]
from tfxl.train.main import run
run()
"""


def console_script(name):
    """The path of an installed console script (tfxl-train, ...) of this environment."""
    import os
    import sys
    return os.path.join(os.path.dirname(sys.executable), name)


# -- trainer tests: a model for a prepared data dir, fast leases ---------------------------------

def vocab_size_of(data_dir):
    """The vocabulary size in `data_dir`'s manifest (the model's `vocab_size`)."""
    import json
    import os
    with open(os.path.join(data_dir, "manifest.json")) as f:
        return json.load(f)["vocab_size"]


def data_config(data_dir, tgt_len=8, **overrides):
    """The trainer tests' model for `data_dir` (vocabulary from its manifest; segment and memory
    length `tgt_len`, the data's): `tiny_config` with one layer, dropout on and a small
    `init_std` so that a few steps of training stay finite; `overrides` win."""
    return tiny_config(**{**dict(vocab_size=vocab_size_of(data_dir), n_layer=1, d_head=8,
                                 d_inner=32, dropout=0.1, tgt_len=tgt_len, mem_len=tgt_len,
                                 init_std=0.02), **overrides})


def language_model_run(config, *, data_dir, model_dir, global_batch, optimizer, strategy=None,
                       init_checkpoint=None, **options):
    """A `TrainingRun` of the language model's task, as tfxl-train builds it: `options` are
    `RunOptions` fields (default strategy: the current one), with the process configured as the
    tools configure it (its dtype policy and seed: the same initial weights every run)."""
    import tensorflow as tf
    from tfxl.train.backends import configure_process
    from tfxl.train.tasks.language_model import LanguageModelTask
    from tfxl.train.loop.run import RunOptions, TrainingRun
    configure_process(mixed_precision=options.get("mixed_precision", "float32"),
                      seed=options.get("seed", 0))
    return TrainingRun(
        LanguageModelTask(config, data_dir=data_dir, init_checkpoint=init_checkpoint),
        strategy=strategy or tf.distribute.get_strategy(),
        options=RunOptions(model_dir=model_dir, global_batch=global_batch, optimizer=optimizer,
                           **options))


def fast_lease():
    """`LeaseParams` for a TrainingRun in the test process: nothing else trains on its model_dir, so
    the 2-second settle (write, wait, read back) is not waited for. test_runs.py tests the lease
    itself with its own settings."""
    from tfxl.train.records.lease import LeaseParams
    return LeaseParams(settle=0.0)


# -- command-line tools ---------------------------------------------------------------------------

STARTED = []  # every process a test starts; one still running when the test ends is killed


def _kill_started():
    while STARTED:
        STARTED.pop().kill()


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """An autouse fixture for a module whose tests start processes they may leave running (a
    failed assertion before the kill): `from factories import STARTED, no_process_left_behind`
    and append each process to STARTED."""
    yield
    _kill_started()


def assert_stopped_with_its_checkpoint(model_dir, step, checkpoint, last_logged_step):
    """What a two-worker run stopped by a signal at `step` leaves in `model_dir` (a Path): the
    checkpoint of that step, named by the stop line, in the chief's folder and worker 1's, the
    train log up to it, and no metrics.json (a finished run's)."""
    import tensorflow as tf
    assert checkpoint == str(model_dir / "checkpoints" / f"ckpt-{step}")
    assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")) == checkpoint
    copy = model_dir / "tmp_worker_checkpoints" / "1"
    assert tf.train.latest_checkpoint(str(copy)) == str(copy / f"ckpt-{step}")
    assert last_logged_step == step
    assert not (model_dir / "metrics.json").exists()


def wait_for_marker(proc, marker, timeout=300):
    """Waits until `marker` (a Path) exists, `proc` has ended or `timeout` seconds passed;
    whether the marker exists (the process reached the point that writes it)."""
    import time
    deadline = time.time() + timeout
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    return marker.exists()


def kill_9_in_the_save(proc, marker, timeout=300):
    """SIGKILL to a HANG_IN_SAVE process once it is inside the save its marker names."""
    assert wait_for_marker(proc, marker, timeout), "the save was never reached"
    proc.kill()  # SIGKILL
    proc.wait()


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def run_tool(module, *args, env=None, timeout=300, **kwargs):
    """`python -m module args` in a new process (a console script as a user runs it): the
    CompletedProcess with text stdout and stderr. `env` replaces the environment (default: this
    process's, which conftest.py quietened); other keyword arguments go to subprocess.run."""
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=timeout, **kwargs)


def run_in_process(module, *args):
    """`module`'s tool run in this process as `run_tool` runs it in a new one: the same
    CompletedProcess (exit status, stdout, stderr), through the same `run()` (flag parsing,
    flagfiles, --help, the error line), without a new process's ~5 s of loading TensorFlow.
    For what a tool decides and writes; a test of the process itself (signals, kill -9, the
    native-log filter, environment variables read at start-up, what a fresh interpreter
    imports) uses `run_tool`. The tool's flags are removed and absl's reset afterwards, so the
    next tool defines its own."""
    import contextlib
    import importlib
    import io
    import logging
    import subprocess
    import sys

    from absl import flags
    from absl import logging as absl_logging

    tool = importlib.import_module(module)
    argv = [module, *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    known, saved_argv = set(flags.FLAGS), sys.argv
    # Every flag at its default, as in a new process, whatever earlier code of this process set
    # (a value assigned or parsed outside this function is kept by absl across parses).
    flags.FLAGS.unparse_flags()
    # Logging as absl's app.run sets up a process: its handler on the root logger, writing to
    # `err`, at the level --verbosity gives, INFO by default (app.run makes it so only in its
    # first run in a process). pytest's logging setup is put back afterwards.
    root, absl_handler = logging.getLogger(), absl_logging.get_absl_handler()
    saved_root_level, had_absl_handler = root.level, absl_handler in root.handlers
    saved_verbosity = flags.FLAGS["verbosity"].default
    flags.FLAGS.set_default("verbosity", absl_logging.converter.ABSL_INFO)
    absl_logging.use_absl_handler()
    log_handler = absl_handler.python_handler
    saved_log_stream, log_handler.stream = log_handler.stream, err
    # TensorFlow's Python logs (its own handler holds an earlier stderr): what the tool lets
    # through its filters reaches `err` too, as it would a process's stderr.
    tensorflow_log = logging.StreamHandler(err)
    logging.getLogger("tensorflow").addHandler(tensorflow_log)
    sys.argv, code = argv, 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                tool.run()
            except SystemExit as exit_:  # absl's app.run always exits
                code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    finally:
        sys.argv, log_handler.stream = saved_argv, saved_log_stream
        logging.getLogger("tensorflow").removeHandler(tensorflow_log)
        for name in set(flags.FLAGS) - known:
            delattr(flags.FLAGS, name)
        flags.FLAGS.unparse_flags()
        flags.FLAGS.set_default("verbosity", saved_verbosity)
        if not had_absl_handler:
            root.removeHandler(absl_handler)
        root.setLevel(saved_root_level)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def assert_one_error_line(result, *needles):
    """A user's mistake as every tool must report it: exit status 2, exactly one `error:` line on
    stderr containing every one of `needles`, no traceback. `result` is a CompletedProcess or a
    (returncode, stderr) pair; returns the error line."""
    code, err = (result.returncode, result.stderr) if hasattr(result, "returncode") else result
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, f"exit status {code}, not 2: {err[-2000:]}"
    assert len(errors) == 1, f"{len(errors)} error: lines, not 1: {err[-2000:]}"
    assert "Traceback" not in err, err[-3000:]
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    return errors[0]


# -- resume tests: one trained model_dir per file, a copy per test --------------------------------

def trained_model_dir_fixtures(train, steps=20):
    """The two fixtures of a file of resume tests, for its `train(data_dir, model_dir, steps)`:
    `trained_to_<steps>` (module scope: one model_dir trained once, from the file's `data_dir`
    fixture) and `trained_copy` (each test's own copy of it: checkpoint paths are relative, so
    the copy resumes from its own, as `train(data_dir, tmp_path / "m", steps)` would leave it).
    Assign both at module level: `trained_to_20, trained_copy = trained_model_dir_fixtures(train)`.
    """
    import shutil
    from pathlib import Path

    import pytest

    @pytest.fixture(scope="module", name=f"trained_to_{steps}")
    def trained(data_dir, tmp_path_factory):
        model_dir = tmp_path_factory.mktemp(f"trained_to_{steps}") / "m"
        train(data_dir, model_dir, steps)
        return model_dir

    @pytest.fixture(name="trained_copy")
    def copy(request, tmp_path):
        return Path(shutil.copytree(request.getfixturevalue(f"trained_to_{steps}"),
                                    tmp_path / "m"))

    return trained, copy


# -- exports as TF Serving runs them --------------------------------------------------------------

def load_as_served(export_dir):
    """An export loaded as TF Serving loads it: (a TF1 session on its "serve" MetaGraphDef, its
    signature_defs by name), for `serve`. Close the session when done."""
    import tensorflow as tf
    session = tf.compat.v1.Session(graph=tf.Graph())
    meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
    return session, meta_graph.signature_def


# One callable per signature and inputs of a served session: session -> {key: callable}.
_SERVED_CALLABLES = weakref.WeakKeyDictionary()


def serve(served, signature, **feeds):
    """`signature`'s outputs for `feeds`, fed by the signature's tensor names as TF Serving feeds
    them: session.run would check shapes client-side first, a callable (C++
    Session::RunCallable) does not, so a request of any shape reaches the entry checks.
    served: `load_as_served`'s pair."""
    import numpy as np
    from tensorflow.core.protobuf import config_pb2
    session, signature_defs = served
    signature_def = signature_defs[signature]
    outputs = sorted(signature_def.outputs)
    # One callable per signature and inputs: making one optimises the graph (about a second).
    callables = _SERVED_CALLABLES.setdefault(session, {})
    key = (signature, tuple(feeds))
    if key not in callables:
        callables[key] = session._make_callable_from_options(config_pb2.CallableOptions(
            feed=[signature_def.inputs[name].name for name in feeds],
            fetch=[signature_def.outputs[name].name for name in outputs]))
    return dict(zip(outputs, callables[key](*[np.asarray(value) for value in feeds.values()])))



def assert_refused_at_the_entry(served, signature, feeds, message):
    """A bad request fed as TF Serving feeds it (`serve`: values in the signature's dtypes, no
    client-side shape check) fails with one InvalidArgumentError from the entry checks (an
    assert), whose text matches `message`: not an error from an op deep inside the model."""
    import re

    import numpy as np
    import pytest
    import tensorflow as tf
    specs = served[1][signature].inputs
    feeds = {name: np.asarray(value, tf.dtypes.as_dtype(specs[name].dtype).as_numpy_dtype)
             for name, value in feeds.items()}
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        serve(served, signature, **feeds)
    assert error.value.message.startswith("assertion failed: "), error.value.message
    assert re.search(message, error.value.message), error.value.message


def prepare_labelled(root, documents, **config):
    """A tfxl-prepare-classification data dir `root/data` of `documents` [(text, label), ...]
    (JSON lines, every document in train unless `config` says otherwise; bytes tokenizer)."""
    import json

    from tfxl.data.classification import ClassificationConfig, prepare_classification
    source = root / "labelled.jsonl"
    source.write_text("".join(json.dumps({"text": text, "label": label}) + "\n"
                              for text, label in documents))
    prepare_classification(ClassificationConfig(**{
        **dict(output_dir=str(root / "data"), train=[str(source)], valid_fraction=0.0,
               test_fraction=0.0), **config}), log=lambda *a: None)
    return root / "data"


# -- gs:// tools in process: one worker inside the GCS emulator's namespace -----------------------

# The worker's loop: one JSON request a line on stdin, one JSON reply a line on a private copy of
# its stdout (fd 1 itself goes to stderr, so no stray write lands in the replies).
_GCS_WORKER = r"""
import contextlib, io, json, os, sys, traceback
sys.path.insert(0, sys.argv[1])
from factories import run_in_process
replies = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
for line in sys.stdin:
    request = json.loads(line)
    os.chdir(request["cwd"])
    if "module" in request:
        done = run_in_process(request["module"], *request["args"])
        reply = dict(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr)
    else:
        out, err, code = io.StringIO(), io.StringIO(), 0
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                exec(request["code"], {"__name__": "__main__"})
        except BaseException:
            code = 1
            err.write(traceback.format_exc())
        reply = dict(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
    replies.write(json.dumps(reply) + "\n")
    replies.flush()
"""


# No cache of TensorFlow's GCS client outlives a request, as none outlives a tool's own process:
# objects the test process rewrites between requests (a lease.json) are read afresh, not "File
# contents are inconsistent" against a stat cached (5 s by default) in an earlier request.
_NO_GCS_CACHE = {"GCS_STAT_CACHE_MAX_AGE": "0", "GCS_MATCHING_PATHS_CACHE_MAX_AGE": "0",
                 "GCS_READ_CACHE_MAX_SIZE_MB": "0"}


class GcsWorker:
    """One Python process inside the GCS emulator's namespace (`gcs.popen`) that runs gs:// tools
    through their `run()` (`run_in_process` there) and Python code, one after another: what
    `gcs.run` of each tool gives (exit status, stdout, stderr), with one TensorFlow start rather
    than one per tool. A context manager (`with GcsWorker(gcs) as worker:`); the `gcs_worker`
    fixture is the session's. A request after the process ended (killed on a timeout) starts a
    new one. A test of the process itself (a kill -9) starts its own with `gcs.popen`; a test may
    signal the worker (`pid`) while a `submit`ted tool runs.
    """

    def __init__(self, gcs):
        self._gcs = gcs
        self._start()

    def _start(self):
        import os
        import subprocess
        import sys
        import tempfile
        self._log = tempfile.TemporaryFile("w+")  # the worker's own stderr (native logs)
        self.process = self._gcs.popen([sys.executable, "-c", _GCS_WORKER,
                                        os.path.dirname(os.path.abspath(__file__))],
                                       stdin=subprocess.PIPE, stderr=self._log, env=_NO_GCS_CACHE)
        self.pid = self.process.pid

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self):
        """Ends the worker."""
        import subprocess
        try:
            self.process.stdin.close()
        except OSError:  # it ended with a request unread
            pass
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()
        self._log.close()

    def submit(self, module, *args, cwd):
        """Starts tool `module` with `args` in working directory `cwd`; `result` waits for it."""
        self._send(dict(module=module, args=[str(a) for a in args], cwd=str(cwd)))

    def result(self, timeout=300):
        """The CompletedProcess of the tool or code submitted last."""
        import json
        import select
        import subprocess
        readable, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if readable else ""
        if not line:
            self.process.kill()
            self.process.wait()
            self._log.seek(0)
            raise RuntimeError(f"the gs:// worker gave no reply ({timeout} s allowed; exit status "
                               f"{self.process.returncode}): {self._log.read()[-5000:]}")
        reply = json.loads(line)
        return subprocess.CompletedProcess(self._request, reply["returncode"], reply["stdout"],
                                           reply["stderr"])

    def tool(self, module, *args, cwd, timeout=300):
        """`run_in_process(module, *args)` in the worker, in `cwd`: its CompletedProcess."""
        self.submit(module, *args, cwd=cwd)
        return self.result(timeout)

    def python(self, code, *, cwd, timeout=300):
        """`code` exec'd in the worker (as `__main__`, in `cwd`): returncode 0, or 1 with the
        traceback on stderr; what it printed on stdout."""
        self._send(dict(code=code, cwd=str(cwd)))
        return self.result(timeout)

    def _send(self, request):
        import json
        if self.process.poll() is not None:
            self.close()
            self._start()
        self._request = request
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
