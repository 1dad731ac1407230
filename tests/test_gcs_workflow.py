"""The README workflow as a pod user runs it: every path on `gs://`, against a real GCS API.

Each step is the documented command, run through its `run()` by one worker process inside the
emulator's namespace (tests/gcs_emulator.py; the `gcs_worker` fixture, factories.GcsWorker: one
TensorFlow start, not ten; the SIGTERM goes to that process while it trains): corpus in a bucket
-> tfxl-prepare -> tfxl-train from a gs:// flagfile (stopped by SIGTERM mid-run and resumed) ->
tfxl-eval --output -> tfxl-export -> tfxl-generate from the model_dir (gs:// --prompt_file) and
from the export -> `.keras` save, load and `model.export`, keras-hub preset round trip -> warm
start from the bucket's `.keras` -> saved_model_cli on the export.
No step may create a local `gs:` folder.
"""

import json
import os
import signal
import time

import pytest

pytestmark = [pytest.mark.large, pytest.mark.subprocess]

CORPUS = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(300))
# The flagfile asks for far more steps than any run here makes: the stopped run is still training
# when the signal comes, however fast this machine is; the later runs say how far to go.
TRAIN = ["--train_batch_size=2", "--train_steps=100000", "--steps_per_loop=2", "--save_every=4",
         "--n_layer=1", "--d_model=16", "--n_head=2", "--d_head=8", "--d_inner=32",
         "--tgt_len=8", "--mem_len=8", "--eval_tgt_len=8", "--eval_mem_len=16", "--seed=3",
         "--lease_settle=0"]  # one trainer at a time here: no settle to wait


# saved_model_cli as its console script runs it; its flags, defined at import, are removed after.
SAVED_MODEL_CLI = """
import sys
from absl import flags
known = set(flags.FLAGS)
from tensorflow.python.tools import saved_model_cli
sys.argv = ["saved_model_cli", "show", "--dir", {export!r}, "--all"]
try:
    saved_model_cli.main()
except SystemExit as exit_:
    assert not exit_.code, exit_.code
finally:  # the worker runs other tools after it
    for name in set(flags.FLAGS) - known:
        delattr(flags.FLAGS, name)
    flags.FLAGS.unparse_flags()
"""


def test_the_readme_workflow_runs_with_every_path_on_gs(gcs, gcs_worker, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    url = gcs.url
    gcs.write("corpus/train.txt", CORPUS)
    gcs.write("corpus/valid.txt", CORPUS[:4000])
    gcs.write("prompt.txt", "def f(")
    gcs.write("run.flags", "\n".join(["# a pod user's flagfile", *TRAIN]) + "\n")
    worker = gcs_worker

    def tool(module, *args):
        result = worker.tool(module, *args, cwd=cwd)
        assert result.returncode == 0, (module, result.stdout[-2000:], result.stderr[-3000:])
        return result

    # 1. prepare: corpus, output, shards, vocabulary and manifest in the bucket.
    tool("tfxl.data.prepare", "--tokenizer=chars", f"--train={url('corpus/train.txt')}",
         f"--valid={url('corpus/valid.txt')}", f"--test={url('corpus/valid.txt')}",
         "--tgt_len=8", "--num_streams=4", f"--output_dir={url('data')}")
    assert any(name.endswith("manifest.json") for name in gcs.list("data/"))

    # 2. train from a gs:// flagfile; SIGTERM to the worker once the first checkpoint is in
    # the bucket, resume.
    data, run = url("data"), url("runs/tiny")
    worker.submit("tfxl.train.main", f"--flagfile={url('run.flags')}", f"--data_dir={data}",
                  f"--model_dir={run}", cwd=cwd)
    deadline = time.time() + 240
    while not any("ckpt-4.index" in n for n in gcs.list("runs/tiny/checkpoints/")):
        assert worker.process.poll() is None and time.time() < deadline, worker.result(1)
        time.sleep(0.5)
    os.kill(worker.pid, signal.SIGTERM)
    stopped = worker.result(240)
    assert stopped.returncode == 143 and "run the same command to resume" in stopped.stdout, (
        stopped.stdout, stopped.stderr[-3000:])
    stopped_at = int(stopped.stdout.split("stopped by SIGTERM at step ")[1].split(":")[0])
    tool("tfxl.train.main", f"--flagfile={url('run.flags')}", f"--data_dir={data}",
         f"--model_dir={run}", "--train_steps=12")

    # 3. evaluate, the result written to the bucket.
    tool("tfxl.train.evaluate", f"--data_dir={data}", f"--model_dir={run}", "--split=test",
         f"--output={url('eval/test.json')}")
    assert json.loads(gcs.read("eval/test.json"))["tokens"] > 0

    # 4. export (inspected with saved_model_cli below), generate from the model_dir and from
    # the export.
    tool("tfxl.serving.export_main", f"--model={run}", f"--data_dir={data}",
         f"--output_dir={url('exports/tiny')}")
    assert "exports/tiny/1/saved_model.pb" in gcs.list("exports/tiny/")
    sampling = ["--max_new_tokens=8", "--seed=1"]
    from_dir = tool("tfxl.serving.generate_main", f"--model={run}", f"--data_dir={data}",
                    f"--prompt_file={url('prompt.txt')}", *sampling)
    from_export = tool("tfxl.serving.generate_main", f"--model={url('exports/tiny/1')}",
                       "--prompt=def f(", *sampling)
    assert from_dir.stdout == from_export.stdout and len(from_dir.stdout) > 1

    # 5. In Python: the train log read back through tfxl's reader, a .keras save and load
    # and `model.export`, a keras-hub preset written and read.
    python = worker.python(
        "import json, keras, tfxl\n"
        "from tfxl.train.records.train_log import read_train_log\n"
        "from tfxl.checkpoints.loading import load_language_model\n"
        "from tfxl.hub import TransfoXLCausalLM, causal_lm_from_model_dir\n"
        f"print('LOG', json.dumps([r['step'] for r in read_train_log({run!r})]))\n"
        f"model = load_language_model({run!r})\n"
        f"model.save({url('lm.keras')!r})\n"
        f"again = keras.saving.load_model({url('lm.keras')!r})\n"
        "assert [w.shape for w in again.weights] == [w.shape for w in model.weights]\n"
        f"model.export({url('exported_from_python')!r})\n"
        f"lm = causal_lm_from_model_dir({run!r}, {data!r}, sequence_length=16)\n"
        f"lm.save_to_preset({url('presets/tiny')!r})\n"
        f"again = TransfoXLCausalLM.from_preset({url('presets/tiny')!r})\n"
        "print(again.generate('def f(', max_length=12))\n", cwd=cwd)
    assert python.returncode == 0, python.stderr[-3000:]
    # Each step once; that the resumed steps equal an uninterrupted run's is
    # tests/test_preemption.py's (local paths: the same code, cheaper).
    logged = json.loads(python.stdout.split("LOG ", 1)[1].splitlines()[0])
    assert logged == list(range(1, max(stopped_at, 12) + 1)), logged
    assert "exported_from_python/saved_model.pb" in gcs.list("exported_from_python/")
    assert any(name.endswith("config.json") for name in gcs.list("presets/tiny/"))

    # 6. A warm start from the bucket's .keras file.
    tool("tfxl.train.main", f"--flagfile={url('run.flags')}", f"--data_dir={data}",
         f"--model_dir={url('runs/warm')}", f"--init_checkpoint={url('lm.keras')}",
         "--train_steps=2")

    # The export of step 4 inspected.
    cli = worker.python(SAVED_MODEL_CLI.format(export=url("exports/tiny/1")), cwd=cwd)
    assert cli.returncode == 0 and "score_document" in cli.stdout, cli.stderr[-2000:]

    # Nothing local: no `gs:` folder anywhere under the working directory.
    assert not [p for p, dirs, _ in os.walk(cwd) for d in dirs if d.startswith("gs:")]
