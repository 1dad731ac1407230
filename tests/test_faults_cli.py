"""Faults a user can cause on the command line: one `error:` line naming what was wrong and where,
exit status 2, and nothing already written overwritten or lost."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from factories import assert_one_error_line as assert_refused, run_in_process, tiny_config
from tfxl import TransfoXLLM
from tfxl import cli
from tfxl.cli import TOOLS
from tfxl.data import prepare as prepare_lib
from tfxl.model_dir import check_data_fingerprint
from tfxl.data.manifest import load_manifest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One flag of each tool's own, which its --help must list with its help text.
OWN_FLAG = {"tfxl.data.prepare": ("--num_streams", "Streams per split S."),
            "tfxl.data.prepare_classification": ("--label_field",
                                                 "The label's JSON field or CSV column."),
            "tfxl.train.main": ("--train_steps", "Total optimisation steps."),
            "tfxl.train.classify_main": ("--grad_segments", "Trailing segments read with gradient"),
            "tfxl.train.evaluate": ("--split", "Split to evaluate."),
            "tfxl.classification.evaluate_main": ("--max_tokens",
                                                  "Read each document's first N tokens only"),
            "tfxl.serving.export_main": ("--score_top_k", "score returns the top-k"),
            "tfxl.serving.generate_main": ("--prompt_file", "Read the prompt from this file."),
            "tfxl.convert.main": ("--hf_config", "Hugging Face config.json"),
            "tfxl.analysis.context_main": ("--contexts", "The context lengths c"),
            "tfxl.train.demo": ("--eval_mem_lens", "Evaluation memory lengths to plot.")}
CHATTER = ("oneDNN", "cuda", "Sharding callback", "I0000", "E0000", "absl::InitializeLog")


def run_tool(module, *args, **env):
    """`python -m module args` in a new process as a user runs it, TF_CPP_MIN_LOG_LEVEL unset
    unless given: for what only a process shows (TensorFlow's native log lines). What a tool
    decides runs in this process (`run_in_process`), sparing a TensorFlow start per run."""
    environ = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    environ["PYTHONPATH"] = REPO + os.pathsep + environ.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          text=True, env={**environ, **env}, timeout=300)


# --------------------------------------------------------------------------- usage errors, help
assert set(OWN_FLAG) == set(TOOLS.values())


@pytest.mark.parametrize("module", sorted(OWN_FLAG))
def test_usage_errors_exit_2_and_help_lists_the_tools_own_flags(module):
    assert_refused(run_in_process(module, "--no_such_flag=1"), "no_such_flag")
    shown = run_in_process(module, "--help")
    assert shown.returncode == 0, shown.stderr[-2000:]
    flag, help_text = OWN_FLAG[module]
    assert f"{flag}:" in shown.stdout and help_text in " ".join(shown.stdout.split())


def test_bad_flag_values_and_stray_arguments_exit_2():
    assert_refused(run_in_process("tfxl.serving.generate_main", "--max_new_tokens=many"),
                   "max_new_tokens", "many")
    assert_refused(run_in_process("tfxl.train.main", "stray", "words"),
                   "unexpected arguments: stray words")


# --------------------------------------------------------------------------- fixtures
def prepare_chars(output_dir, text, tmp_path):
    corpus = tmp_path / f"{os.path.basename(output_dir)}.txt"
    corpus.write_text(text)
    return prepare_lib.prepare(prepare_lib.PrepareConfig(
        output_dir=str(output_dir), train=[str(corpus)], valid=[str(corpus)], test=[str(corpus)],
        tokenizer="chars", tgt_len=4, num_streams=1), log=lambda *_: None)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A model_dir trained (as far as tfxl-train's records go) on `data`; `same_size` has another
    vocabulary of the same size, `other_size` one of another size."""
    tmp_path = tmp_path_factory.mktemp("faults")
    dirs = {name: tmp_path / name for name in ("data", "same_size", "other_size", "model")}
    manifest = prepare_chars(dirs["data"], "abcab cab\n" * 40, tmp_path)
    assert prepare_chars(dirs["same_size"], "xyzxy zxy\n" * 40,
                         tmp_path)["vocab_size"] == manifest["vocab_size"]
    assert prepare_chars(dirs["other_size"], "abcdefgh\n" * 40,
                         tmp_path)["vocab_size"] != manifest["vocab_size"]
    config = tiny_config(vocab_size=manifest["vocab_size"], n_layer=1, d_model=8, d_head=4,
                         d_inner=8, tgt_len=4, mem_len=4, eval_mem_len=8, init_std=0.02)
    model = TransfoXLLM(config)
    model.build((None, 4))
    (dirs["model"] / "checkpoints").mkdir(parents=True)
    (dirs["model"] / "config.json").write_text(json.dumps(config.to_dict()))
    tf.train.CheckpointManager(tf.train.Checkpoint(model=model),
                               str(dirs["model"] / "checkpoints"), 1).save()
    check_data_fingerprint(str(dirs["model"]), manifest, str(dirs["data"]), store=True)
    return dirs


# --------------------------------------------------------------------------- vocabularies
def test_export_and_generate_refuse_another_vocabulary(trained, tmp_path):
    exports = tmp_path / "exports"
    export = ("tfxl.serving.export_main", f"--model={trained['model']}",
              f"--output_dir={exports}")
    assert_refused(run_in_process(*export, f"--data_dir={trained['same_size']}"),
                   str(trained["same_size"]), "another vocabulary")
    assert not exports.exists()
    assert_refused(run_in_process(*export, f"--data_dir={trained['other_size']}"),
                   str(trained["other_size"]), "vocabulary of")
    generate = ("tfxl.serving.generate_main", f"--model={trained['model']}", "--prompt=ab",
                "--max_new_tokens=3")
    assert_refused(run_in_process(*generate, f"--data_dir={trained['same_size']}"),
                   str(trained["same_size"]), "another vocabulary")
    assert_refused(run_in_process(*generate, f"--data_dir={trained['other_size']}"),
                   str(trained["other_size"]), "vocabulary of")


@pytest.mark.large
def test_generate_from_an_export_needs_no_data_dir(trained, tmp_path):
    exports = tmp_path / "exports"
    made = run_in_process("tfxl.serving.export_main", f"--model={trained['model']}",
                    f"--data_dir={trained['data']}", f"--output_dir={exports}")
    assert made.returncode == 0, made.stderr[-2000:]
    sampling = ["--prompt=abc", "--max_new_tokens=6", "--seed=3"]
    alone = run_in_process("tfxl.serving.generate_main", f"--model={exports / '1'}", *sampling)
    with_data = run_in_process("tfxl.serving.generate_main", f"--model={trained['model']}",
                         f"--data_dir={trained['data']}", *sampling)
    assert alone.returncode == 0, alone.stderr[-2000:]
    assert with_data.returncode == 0, with_data.stderr[-2000:]
    assert alone.stdout == with_data.stdout and len(alone.stdout) > 1
    assert_refused(run_in_process("tfxl.serving.generate_main", f"--model={exports / '1'}",
                            f"--data_dir={trained['same_size']}", *sampling),
                   "another vocabulary")


# --------------------------------------------------------------------------- quiet tools
@pytest.mark.large
@pytest.mark.subprocess
def test_tools_are_quiet_unless_verbose(trained):
    model_dir = trained["model"]
    evaluate = ("tfxl.train.evaluate", f"--data_dir={trained['data']}", f"--model_dir={model_dir}",
                "--max_eval_batches=1")
    quiet = run_tool(*evaluate)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert json.loads(quiet.stdout)["tokens"] > 0
    assert [line for line in quiet.stderr.splitlines()
            if any(word in line for word in CHATTER)] == []
    verbose = run_tool(*evaluate, "--verbosity=1")
    assert verbose.returncode == 0 and verbose.stdout == quiet.stdout
    # "I0000": a TensorFlow C++ INFO line, which every host prints (oneDNN's only with AVX-512).
    assert "I0000" in verbose.stderr


@pytest.mark.large
@pytest.mark.subprocess
def test_training_hides_the_savers_info_but_not_its_own_progress(trained, tmp_path):
    model_dir = tmp_path / "model"
    train = ("tfxl.train.main", f"--data_dir={trained['data']}", f"--model_dir={model_dir}",
             "--n_layer=1", "--d_model=8", "--n_head=2", "--d_head=4", "--d_inner=8",
             "--tgt_len=4", "--mem_len=4", "--train_batch_size=1", "--train_steps=2",
             "--steps_per_loop=1", "--save_every=1")
    quiet = run_tool(*train)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert [line for line in quiet.stderr.splitlines()
            if any(word in line for word in CHATTER)] == []
    assert "done: step 2" in quiet.stdout


def test_a_bad_model_description_is_one_error_line_naming_its_source(trained, tmp_path):
    """tfxl-train and tfxl-convert describe the model by the same rule (tfxl.cli.resolve_config)
    and refuse a bad one the same way, before anything is written."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"n_layer": 0}))
    model_dir = tmp_path / "model"
    assert_refused(run_in_process("tfxl.train.main", f"--data_dir={trained['data']}",
                            f"--model_dir={model_dir}", f"--config={bad}"),
                   "n_layer must be > 0", f"--config={bad}")
    assert not model_dir.exists()
    output = tmp_path / "converted.keras"
    assert_refused(run_in_process("tfxl.convert.main", "--format=tf1", f"--input={tmp_path}",
                            f"--output={output}", "--preset=tiny", f"--config={bad}"),
                   "n_layer must be > 0", "--preset=tiny", f"--config={bad}")
    assert not output.exists()


# --------------------------------------------------------------------------- tfxl-prepare's writes
def prepare_cli(argv, capsys):
    values = flags.FlagValues()
    prepare_lib.define_flags(values)
    values(["tfxl-prepare", *map(str, argv)])
    code = cli.exit_status(lambda argv: prepare_lib.main(argv, values), ["tfxl-prepare"])
    return code, capsys.readouterr().err


def splits(corpus):
    return [f"--{split}={corpus}" for split in ("train", "valid", "test")]


def snapshot(directory):
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


def prepared_then_overwritten(out, tmp_path, capsys, corpus_bytes):
    """Prepares a small corpus into `out`, then --overwrite's it with a `corpus_bytes` one."""
    small, big = tmp_path / "small.txt", tmp_path / "big.txt"
    small.write_bytes(b"hello world\n" * 10)
    big.write_bytes(np.random.default_rng(0).integers(97, 123, corpus_bytes, np.uint8).tobytes())
    assert prepare_cli([*splits(small), f"--output_dir={out}", "--tgt_len=8",
                        "--num_streams=1"], capsys)[0] == 0
    before = snapshot(out)
    code, err = prepare_cli([*splits(big), f"--output_dir={out}", "--tgt_len=8",
                             "--num_streams=1", "--overwrite"], capsys)
    return before, code, err


def assert_one_error_and_data_intact(code, err, before, out, *named):
    assert_refused((code, err), *named)
    assert snapshot(out) == before  # no .tmp-prepare-* left, old data byte for byte
    load_manifest(str(out))


@pytest.mark.subprocess  # mount, chattr
def test_prepare_on_a_full_disk(tmp_path, capsys):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root): "
                    "test_prepare_write_error_keeps_old_data covers the path")
    try:
        out = disk / "data"
        before, code, err = prepared_then_overwritten(out, tmp_path, capsys, 400_000)
        assert_one_error_and_data_intact(code, err, before, out, str(out), "No space left")
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.subprocess  # mount, chattr
def test_prepare_into_a_read_only_directory(tmp_path, capsys):
    out = tmp_path / "data"
    before = None
    try:
        small = tmp_path / "small.txt"
        small.write_bytes(b"hello world\n" * 10)
        assert prepare_cli([*splits(small), f"--output_dir={out}", "--tgt_len=8",
                            "--num_streams=1"], capsys)[0] == 0
        before = snapshot(out)
        if subprocess.run(["chattr", "+i", str(out)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i unavailable: test_prepare_write_error_keeps_old_data covers it")
        code, err = prepare_cli([*splits(small), f"--output_dir={out}", "--tgt_len=4",
                                 "--num_streams=1", "--overwrite"], capsys)
    finally:
        subprocess.run(["chattr", "-i", str(out)], capture_output=True)
    assert_one_error_and_data_intact(code, err, before, out, str(out), "not permitted")


def test_prepare_write_error_keeps_old_data(tmp_path, capsys, monkeypatch):
    """The same without root: the shard writer fails as TensorFlow's does on a full disk."""
    def full_disk(path, *args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, f"{path}; No space left on device")

    out = tmp_path / "data"
    small = tmp_path / "small.txt"
    small.write_bytes(b"hello world\n" * 10)
    assert prepare_cli([*splits(small), f"--output_dir={out}", "--tgt_len=8",
                        "--num_streams=1"], capsys)[0] == 0
    before = snapshot(out)
    monkeypatch.setattr(tf.io, "TFRecordWriter", full_disk)
    code, err = prepare_cli([*splits(small), f"--output_dir={out}", "--tgt_len=4",
                             "--num_streams=1", "--overwrite"], capsys)
    monkeypatch.undo()
    assert_one_error_and_data_intact(code, err, before, out, str(out), "No space left")


# --------------------------------------------------------------------------- ranges and sizes
@pytest.mark.parametrize("flag,least", [("--max_train_bytes=-7", -1), ("--max_eval_bytes=-2", -1),
                                        ("--min_freq=0", 1), ("--max_size=-1", 0),
                                        ("--wordpiece_vocab_size=0", 1)])
def test_prepare_refuses_an_option_out_of_range(tmp_path, capsys, flag, least):
    """-1 is the byte caps' documented default, 0 none: -7 is refused, not taken for -1."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"hello world\n" * 10)
    out = tmp_path / "data"
    code, err = prepare_cli([*splits(corpus), f"--output_dir={out}", "--tgt_len=8",
                             "--num_streams=1", flag], capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and errors == [f"error: {flag} is out of range: it must be >= {least}"]
    assert not out.exists()


def test_eval_says_whether_its_result_covers_the_whole_split(trained):
    evaluate = ("tfxl.train.evaluate", f"--data_dir={trained['data']}",
                f"--model_dir={trained['model']}")
    whole = run_in_process(*evaluate)
    partial = run_in_process(*evaluate, "--max_eval_batches=2")
    assert whole.returncode == 0 and partial.returncode == 0, partial.stderr[-2000:]
    whole, partial = json.loads(whole.stdout), json.loads(partial.stdout)
    split_tokens = load_manifest(str(trained["data"]))["splits"]["valid"]["tokens"]
    assert (whole["tokens"], whole["partial"]) == (split_tokens, False)
    assert (partial["tokens"], partial["partial"]) == (2 * 4, True)


def test_a_data_dir_that_is_a_file_is_named_as_one(trained, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert_refused(run_in_process("tfxl.train.evaluate", f"--model_dir={trained['model']}",
                            f"--data_dir={a_file}"),
                   f"--data_dir={a_file} is a file, not a directory")
    with pytest.raises(ValueError, match=f"^data directory {a_file} is a file, not a directory"):
        load_manifest(str(a_file))


def test_eval_refuses_sizes_no_machine_holds_before_building_the_model(trained, tmp_path):
    evaluate = ("tfxl.train.evaluate", f"--model_dir={trained['model']}")
    output = tmp_path / "result.json"
    # 10**11 slots: some 30 TiB, more than any host has
    refused = assert_refused(run_in_process(*evaluate, f"--data_dir={trained['data']}",
                                      "--mem_len=100000000000", f"--output={output}"),
                             "the estimated memory of this evaluation",
                             "--mem_len (100000000000, flag --mem_len)",
                             "--tgt_len (4, config.json tgt_len", "--eval_batch_size (1)")
    assert "OOM" not in refused and not output.exists()


def test_a_truncated_keras_file_is_named_as_such(tmp_path):
    from tfxl.checkpoints.loading import load_language_model
    path = tmp_path / "model.keras"
    TransfoXLLM(tiny_config()).save(path)
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ValueError) as refused:
        load_language_model(str(path))
    assert str(refused.value) == (f"{path} is not a valid .keras file (not a zip archive: File "
                                  "is not a zip file; truncated, or not a .keras file)")


def test_train_refuses_a_memory_no_machine_holds_before_anything_is_written(trained, tmp_path):
    """tfxl-train's plan (train/planning/plan.py) names --mem_len and its value; no TensorFlow
    OOM."""
    model_dir = tmp_path / "model"
    refused = assert_refused(run_in_process("tfxl.train.main", f"--data_dir={trained['data']}",
                                      f"--model_dir={model_dir}", "--preset=tiny", "--tgt_len=4",
                                      "--train_batch_size=1", "--mem_len=1000000000"),
                             "the estimated memory", "--mem_len (1000000000)")
    assert "OOM" not in refused and not model_dir.exists()
