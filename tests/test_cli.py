"""The one model-config rule of every tool (tfxl.cli.resolve_config), the model flags generated
from TransfoXLConfig's fields, the one resolution of evaluation settings, and flagfiles read
through tf.io.gfile."""

import dataclasses
import json
import os
import sys

import pytest
from absl import flags

from tfxl import cli
from tfxl.config import PRESETS, TransfoXLConfig


def parsed(*argv, preset_default=None, exclude=()):
    values = flags.FlagValues()
    cli.define_config_flags(preset_default=preset_default, exclude=exclude, flag_values=values)
    values(["tool", *map(str, argv)])
    return values


def test_every_config_field_has_a_typed_flag_with_its_help():
    fields = {f.name for f in dataclasses.fields(TransfoXLConfig)}
    values = parsed()
    assert fields <= set(values) and {"preset", "config"} <= set(values)
    kinds = {"n_layer": "int", "dropout": "float", "untie_r": "bool", "d_embed": "int",
             "eval_same_length": "bool", "cutoffs": "comma separated list of strings",
             "tie_projs": "comma separated list of strings", "architecture": "string enum"}
    for name, kind in kinds.items():
        assert values[name].flag_type() == kind, name
    for name in fields:
        assert values[name].default is None and len(values[name].help) > 40, name
    assert "number of token ids V" in values["vocab_size"].help
    assert "vocab_size" not in parsed(exclude=("vocab_size",))


def test_config_is_layered_on_the_preset_then_the_flags(tmp_path):
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"n_layer": 3, "dropout": 0.2}))
    config = cli.resolve_config(parsed("--preset=enwik8_base", f"--config={partial}",
                                       "--dropout=0.3", "--noeval_same_length"))
    preset = PRESETS["enwik8_base"]
    assert config.n_layer == 3  # --config over --preset
    assert config.dropout == 0.3 and config.eval_same_length is False  # flags over --config
    assert (config.d_model, config.eval_mem_len) == (preset["d_model"], preset["eval_mem_len"])
    # A whole config.json (a model_dir's) gives exactly that model, whatever the preset.
    whole = tmp_path / "whole.json"
    stored = TransfoXLConfig(n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32)
    whole.write_text(stored.to_json())
    assert cli.resolve_config(parsed(f"--config={whole}", preset_default="tiny")) == stored


def test_tool_defaults_sources_and_fixed_fields_take_their_places(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"layer_norm_epsilon": 1e-6}))
    values = parsed("--preset=tiny", "--d_model=32")
    got = cli.resolve_config(values, defaults={"layer_norm_epsilon": 1e-12, "n_layer": 5},
                             sources=[("hf", {"n_layer": 4, "d_model": 48})],
                             fixed={"vocab_size": 99})
    assert (got.layer_norm_epsilon, got.n_layer, got.d_model, got.vocab_size) == (
        1e-12, 4, 32, 99)
    got = cli.resolve_config(parsed("--preset=tiny", f"--config={config}"),
                             defaults={"layer_norm_epsilon": 1e-12})
    assert got.layer_norm_epsilon == 1e-6  # --config over the tool's default


def test_a_presets_tie_projs_follows_new_cutoffs_unless_given():
    changed = cli.resolve_config(parsed("--preset=wt103_base", "--vocab_size=100",
                                        "--cutoffs=10,50"))
    assert changed.cutoffs == (10, 50) and changed.tie_projs is None
    given = cli.resolve_config(parsed("--preset=wt103_base", "--vocab_size=100",
                                      "--cutoffs=10,50", "--tie_projs=true,false,true"))
    assert given.tie_projs == (True, False, True)


def test_bad_model_input_names_where_it_came_from(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"n_layer": 0}))
    with pytest.raises(ValueError, match=rf"n_layer must be > 0.*--preset=tiny, --config={bad}"):
        cli.resolve_config(parsed("--preset=tiny", f"--config={bad}"))
    bad.write_text(json.dumps({"n_layers": 2}))
    with pytest.raises(ValueError, match=rf"--config {bad}: unknown .*n_layers"):
        cli.resolve_config(parsed(f"--config={bad}"))
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=rf"--config {bad} is not valid JSON"):
        cli.resolve_config(parsed(f"--config={bad}"))
    with pytest.raises(ValueError, match="--cutoffs: not integers: 1,x"):
        cli.resolve_config(parsed("--cutoffs=1,x"))
    with pytest.raises(ValueError, match="--tie_projs: 'maybe' is not true/false"):
        cli.resolve_config(parsed("--tie_projs=true,maybe"))


# ------------------------------------------------------------------------- evaluation settings
def test_eval_settings_argument_then_eval_field_then_training_value():
    config = TransfoXLConfig(tgt_len=8, mem_len=8, clamp_len=-1, same_length=False,
                             eval_mem_len=32, eval_same_length=True)
    assert config.eval_settings() == dict(tgt_len=8, mem_len=32, clamp_len=-1, same_length=True)
    assert config.eval_settings(mem_len=0, tgt_len=4) == dict(tgt_len=4, mem_len=0, clamp_len=-1,
                                                              same_length=True)
    assert config.eval_settings_sources(clamp_len=5) == {
        "tgt_len": (8, "tgt_len (training)"), "mem_len": (32, "eval_mem_len"),
        "clamp_len": (5, "argument"), "same_length": (True, "eval_same_length")}
    for bad, message in ((dict(tgt_len=0), "evaluation tgt_len must be >= 1, got 0"),
                         (dict(mem_len=-1), "evaluation mem_len must be >= 0, got -1"),
                         (dict(clamp_len=-2), "evaluation clamp_len must be >= -1, got -2")):
        with pytest.raises(ValueError, match=message):
            config.eval_settings(**bad)


def test_eval_flags_feed_eval_settings():
    values = flags.FlagValues()
    cli.define_eval_flags(flag_values=values)
    values(["tool", "--mem_len=64"])
    overrides = cli.eval_overrides(flag_values=values)
    assert overrides == dict(tgt_len=None, mem_len=64, clamp_len=None, same_length=None)
    assert TransfoXLConfig(eval_mem_len=16).eval_settings(**overrides)["mem_len"] == 64


# ------------------------------------------------------------------------------ flagfiles
def write_flagfiles(tmp_path):
    (tmp_path / "inner.flags").write_text("--mem_len=9\n# --mem_len=1\n")
    (tmp_path / "outer.flags").write_text(
        "# a comment\n// another\n\n   \n--n_layer=3\n"
        f"--flagfile={tmp_path / 'inner.flags'}\n--d_model=32   \n")
    (tmp_path / "late.flags").write_bytes(b"--n_layer=5\r\n--prompt=a\xe2\x80\xa8b")


def test_flagfiles_expand_as_absl_expands_them(tmp_path):
    write_flagfiles(tmp_path)
    argv = ["tool", "--preset=tiny", f"--flagfile={tmp_path / 'outer.flags'}", "--n_head=4",
            "-flagfile", str(tmp_path / "late.flags"), "--flagfile=", "--",
            f"--flagfile={tmp_path / 'inner.flags'}"]
    want = ["tool", "--preset=tiny", "--n_layer=3", "--mem_len=9", "--d_model=32", "--n_head=4",
            "--n_layer=5", "--prompt=a\u2028b", "--",
            f"--flagfile={tmp_path / 'inner.flags'}"]
    assert cli.expand_flagfiles(argv) == want
    assert ["tool", *flags.FlagValues().read_flags_from_files(argv[1:], force_gnu=False)] == want
    assert cli.expand_flagfiles(["tool", "--n_layer=2"]) == ["tool", "--n_layer=2"]


def test_missing_unreadable_and_circular_flagfiles_name_the_file(tmp_path):
    write_flagfiles(tmp_path)
    with pytest.raises(ValueError, match=r"--flagfile=.*none.flags: cannot read \(.*none.flags"):
        cli.expand_flagfiles(["tool", f"--flagfile={tmp_path / 'none.flags'}"])
    (tmp_path / "nests.flags").write_text(f"--flagfile={tmp_path / 'gone.flags'}\n")
    with pytest.raises(ValueError, match=r"gone.flags \(included by .*nests.flags\)"):
        cli.expand_flagfiles(["tool", "--flagfile", str(tmp_path / "nests.flags")])
    (tmp_path / "loop.flags").write_text(f"--flagfile={tmp_path / 'loop.flags'}\n")
    with pytest.raises(ValueError, match="includes itself"):
        cli.expand_flagfiles(["tool", f"--flagfile={tmp_path / 'loop.flags'}"])
    with pytest.raises(ValueError, match="needs a file name"):
        cli.expand_flagfiles(["tool", "--flagfile"])


def test_every_tool_reads_a_flagfile_in_a_bucket(tmp_path, monkeypatch, capsys):
    """cli.run expands a flagfile in a bucket (ram:// stands for one; a local flagfile may name
    one there) before absl parses; a missing one is one error line, exit 2. No local folder named
    like the bucket appears."""
    import tensorflow as tf
    monkeypatch.chdir(tmp_path)
    with tf.io.gfile.GFile("ram://cli-test/run.flags", "w") as f:
        f.write("// from the bucket\n--cli_test_steps=7\n")
    (tmp_path / "local.flags").write_text("--flagfile=ram://cli-test/run.flags\n")
    seen = []

    def define_flags():
        if "cli_test_steps" not in flags.FLAGS:
            flags.DEFINE_integer("cli_test_steps", 1, "A flag of this test.")

    def main(argv):
        seen.append(flags.FLAGS.cli_test_steps)
        return 0

    for flagfile in ("ram://cli-test/run.flags", "local.flags"):
        monkeypatch.setattr(sys, "argv", ["tfxl-test", f"--flagfile={flagfile}"])
        with pytest.raises(SystemExit) as exit_:
            cli.run(main, define_flags)
        assert exit_.value.code == 0 and seen[-1] == 7
    monkeypatch.setattr(sys, "argv", ["tfxl-test", "--flagfile=ram://cli-test/none.flags"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        cli.run(main, define_flags)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1
    assert err[0].startswith("error: --flagfile=ram://cli-test/none.flags: cannot read")
    assert os.listdir(tmp_path) == ["local.flags"]


# ------------------------------------------------------------------------------ range rules
# One rule per field for config files, Python and the model flags (the field's metadata).
OUT_OF_RANGE = [("layer_norm_epsilon", -1.0), ("layer_norm_epsilon", float("nan")),
                ("init_std", float("nan")), ("init_std", 0.0), ("proj_init_std", float("inf")),
                ("dropout", 1.0), ("dropatt", -0.1), ("n_layer", 0), ("d_embed", 0),
                ("mem_len", -1), ("clamp_len", -2), ("eval_tgt_len", 0), ("eval_mem_len", -1),
                ("eval_clamp_len", -5)]


@pytest.mark.parametrize("name, value", OUT_OF_RANGE)
def test_config_files_python_and_flags_refuse_the_same_values(name, value, tmp_path):
    config_json = tmp_path / "config.json"
    config_json.write_text(json.dumps({**TransfoXLConfig().to_dict(), name: value}))
    with pytest.raises(ValueError, match=rf"config.json: TransfoXLConfig: {name} must be"):
        TransfoXLConfig.from_file(str(config_json))  # what tfxl-eval/-export/-generate read
    with pytest.raises(ValueError, match=rf"{name} must be .*--config={config_json}"):
        cli.resolve_config(parsed(f"--config={config_json}"))  # tfxl-train/-convert --config
    with pytest.raises(flags.IllegalFlagValueError, match=rf"--{name}=.*out of range"):
        parsed(f"--{name}={value}")


def test_config_field_types_are_checked_and_whole_numbers_kept():
    for bad in (dict(n_layer=2.5), dict(n_layer="2"), dict(untie_r=2), dict(eval_mem_len=True),
                dict(dropout="0.1")):
        with pytest.raises(ValueError, match=f"{next(iter(bad))} must be"):
            TransfoXLConfig(**bad)
    config = TransfoXLConfig(n_layer=2.0, untie_r=1)
    assert (config.n_layer, type(config.n_layer), config.untie_r) == (2, int, True)


# ------------------------------------------------------------------------------ error lines
def run_tool(monkeypatch, capsys, error, *argv):
    """cli.run of a tool whose main raises `error`: (exit status, stderr lines)."""
    def main(argv):
        raise error

    monkeypatch.setattr(sys, "argv", ["tfxl-test", *argv])
    capsys.readouterr()
    # absl keeps a flag's value across parses: an earlier test of this process may have left
    # --verbosity=1, which a command line without the flag does not reset. `unparse` puts the
    # default back as a default (an assignment would mark it set, and a later tool's own default
    # verbosity would not apply: factories.run_in_process's logs went missing after this test).
    flags.FLAGS["verbosity"].unparse()
    try:
        with pytest.raises(SystemExit) as exit_:
            cli.run(main)
    finally:
        flags.FLAGS["verbosity"].unparse()
    return exit_.value.code, capsys.readouterr().err.splitlines()


def test_error_lines_lose_tensorflows_function_node_prefix_and_verbosity_shows_the_traceback(
        monkeypatch, capsys):
    import tensorflow as tf
    try:
        tf.gather(tf.constant([1, 2]), 5)
    except tf.errors.InvalidArgumentError as err:
        op_error = err
    assert "{{function_node" in str(op_error)
    code, err = run_tool(monkeypatch, capsys, op_error)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: indices = 5 is not in"), err
    code, err = run_tool(monkeypatch, capsys, ValueError("--x=1 is wrong"), "--verbosity=1")
    assert code == 2 and err[0] == "Traceback (most recent call last):", err
    assert err[-2:] == ["ValueError: --x=1 is wrong", "error: --x=1 is wrong"], err


def test_install_hints_say_how_tfxl_is_installed():
    """tfxl is not on PyPI: a hint to `pip install tfxl` or `'tfxl[extra]'` fails. Every hint in
    the code and the manual names the extra as installed from a clone (`pip install '.[hub]'`)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    wrong = re.compile(r"pip install (--\S+ )*['\"]?tfxl\b|tfxl\[")
    files = [*root.glob("tfxl/**/*.py"), *root.glob("train/**/*.py"), *root.glob("tpu/**/*.py"),
             *root.glob("docs/*.md"), root / "README.md", root / "BUILD.md", root / "Makefile"]
    found = [f"{path.relative_to(root)}:{number}: {line.strip()}" for path in files
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if wrong.search(line)]
    assert not found, "\n".join(found)


@pytest.mark.large
@pytest.mark.subprocess
def test_a_test_pass_prints_no_native_start_up_lines():
    """The suite's own output (here one pass of xdist workers, as `make test` runs them) carries
    none of TensorFlow's start-up lines ("Could not find cuda drivers", "failed call to cuInit",
    absl's "WARNING: All log messages before absl::InitializeLog()"); a failure still shows."""
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "1", "-p", "no:cacheprovider", "-p",
         "no:randomly", "tests/test_files.py::test_only_plain_paths_and_file_urls_are_local"],
        cwd=root, capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items()
             if k not in ("TF_CPP_MIN_LOG_LEVEL", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    output = result.stdout + result.stderr
    native = re.compile(r"^([IWE]0000 00:00:|WARNING: All log messages before absl)", re.M)
    assert not native.search(output), output[-3000:]
    assert "1 passed" in output
