"""Serving, conversion and nested flagfiles on gs://, against a real GCS API (the `gcs` fixture,
tests/gcs_emulator.py): TensorFlow's own GCS client, run as a user runs the tools.

Each run is the tool's `run()` in one worker process inside the emulator's namespace (the
`gcs_worker` fixture, factories.GcsWorker: one TensorFlow start), with a working directory that
must stay empty (nothing may create a local folder named like a gs:// path); the test process checks
the bucket past TensorFlow (`gcs.list`, `gcs.read`). What the README workflow does on gs://
(model_dirs, tfxl-eval --output, keras-hub presets, warm starts) is tests/test_gcs_workflow.py's.
"""

import json

import keras
import numpy as np
import pytest

from factories import tiny_lm
from tfxl.data.prepare import PrepareConfig, prepare

pytestmark = pytest.mark.large

ROOT = "serve"


def run_ok(gcs_worker, argv, cwd):
    done = gcs_worker.tool(*argv, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.subprocess
def test_export_and_generate_on_gcs(gcs, gcs_worker, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def f(x):\n    return x\n" * 100)
    data_dir = str(tmp_path / "data")
    prepare(PrepareConfig(output_dir=data_dir, train=[str(corpus)], valid=[str(corpus)],
                          test=[str(corpus)], tokenizer="bytes", tgt_len=6, num_streams=2),
            log=lambda *a: None)
    model = tiny_lm(vocab_size=258, d_model=32, d_head=16, d_inner=64, tgt_len=6, mem_len=6,
                    eval_mem_len=12, init_std=0.1)
    model.save(str(tmp_path / "lm.keras"))
    gcs.write(f"{ROOT}/lm.keras", (tmp_path / "lm.keras").read_bytes())
    url = gcs.url(ROOT)

    # tfxl-export, every flag from a flagfile in the bucket that includes another there.
    gcs.write(f"{ROOT}/flags/inner.flags", f"--output_dir={url}/exports\n")
    gcs.write(f"{ROOT}/flags/export.flags",
              f"# export the .keras model\n--model={url}/lm.keras\n--data_dir={data_dir}\n"
              f"--flagfile={url}/flags/inner.flags\n")
    done = run_ok(gcs_worker, ["tfxl.serving.export_main", f"--flagfile={url}/flags/export.flags"],
                  cwd)
    assert done.stdout.strip() == f"{url}/exports/1"
    names = gcs.list(f"{ROOT}/exports/")
    assert f"{ROOT}/exports/1/saved_model.pb" in names
    assert f"{ROOT}/exports/1/variables/variables.index" in names
    assert f"{ROOT}/exports/1/assets.extra/tfxl_data.json" in names
    assert not [name for name in names if ".tmp-" in name]  # staged locally, never uploaded

    # The next export lists the bucket's versions ("1/" there) and lands as 2; a given version
    # that exists is refused.
    done = run_ok(gcs_worker, ["tfxl.serving.export_main", f"--model={url}/lm.keras",
                           f"--output_dir={url}/exports"], cwd)
    assert done.stdout.strip() == f"{url}/exports/2"
    refused = gcs_worker.tool("tfxl.serving.export_main", f"--model={url}/lm.keras",
                          f"--output_dir={url}/exports", "--version=2", cwd=cwd)
    assert refused.returncode == 2 and "already exists" in refused.stderr

    # tfxl-generate: the prompt from the bucket; the export (its own tokenizer) and the .keras
    # file there give the same greedy text. (From a model_dir in a bucket, tfxl-eval --output
    # and keras-hub presets there: tests/test_gcs_workflow.py.)
    gcs.write(f"{ROOT}/prompt.txt", "def f(")
    sampling = [f"--prompt_file={url}/prompt.txt", "--max_new_tokens=6", "--temperature=0"]
    texts = [run_ok(gcs_worker, ["tfxl.serving.generate_main", *flags, *sampling], cwd).stdout
             for flags in ([f"--model={url}/exports/1"],
                           [f"--model={url}/lm.keras", f"--data_dir={data_dir}"])]
    assert texts[0] == texts[1] and texts[0].strip()

    assert sorted(p.name for p in cwd.iterdir()) == []  # no local "gs:" folder anywhere


@pytest.mark.subprocess
def test_convert_on_gcs(gcs, gcs_worker, tmp_path):
    """tfxl-convert: an .npz state dict and a --config in the bucket to a .keras file and its
    config there, the same model as converted locally."""
    from convert_fixtures import hparams, pytorch_reference, pytorch_state
    from test_convert import assert_matches, segments, tfxl_config
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    hp = hparams()
    state = pytorch_state(hp)
    np.savez(tmp_path / "state.npz", **state)
    gcs.write(f"{ROOT}/convert/state.npz", (tmp_path / "state.npz").read_bytes())
    gcs.write(f"{ROOT}/convert/config.json", json.dumps(tfxl_config(hp).to_dict()))
    url = gcs.url(f"{ROOT}/convert")
    argv = ["tfxl.convert.main", "--format=pytorch", f"--input={url}/state.npz",
            f"--config={url}/config.json", f"--output={url}/out/model.keras"]
    run_ok(gcs_worker, argv, cwd)
    assert set(gcs.list(f"{ROOT}/convert/out/")) == {f"{ROOT}/convert/out/model.keras",
                                                     f"{ROOT}/convert/out/model.config.json"}
    (tmp_path / "model.keras").write_bytes(gcs.read(f"{ROOT}/convert/out/model.keras"))
    import tfxl  # noqa: F401  (registers the classes)
    loaded = keras.saving.load_model(str(tmp_path / "model.keras"))
    segs = segments(hp)
    assert_matches(loaded, pytorch_reference(state, hp, segs), segs)
    refused = gcs_worker.tool(*argv, cwd=cwd)
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    assert sorted(p.name for p in cwd.iterdir()) == []
