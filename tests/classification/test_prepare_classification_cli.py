"""tfxl-prepare-classification: its flags are ClassificationConfig's fields (generated), --help
groups them under headings, it prepares what `prepare_classification` prepares, and a bad input
is one `error:` line, exit 2, with nothing written."""

import dataclasses
import json
import re

from absl import flags

from factories import assert_one_error_line, run_in_process
from tfxl.data import prepare_classification as tool
from tfxl.data.classification import ClassificationConfig, prepare_classification

TOOL = "tfxl.data.prepare_classification"
DOCUMENTS = [("a tale of two cities", "book"), ("x = 1", "code"), ("emma", "book"),
             ("def f(): pass", "code")]


def tool_flags(*argv):
    values = flags.FlagValues()
    tool.define_flags(values)
    values(["tfxl-prepare-classification", *argv])
    return values


def write_jsonl(path, documents):
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in documents))
    return str(path)


def test_every_option_is_one_flag_with_the_fields_default_and_help():
    fields = {field.name: field for field in dataclasses.fields(ClassificationConfig)}
    values = tool_flags("--output_dir=out")
    assert sorted(values) == sorted(fields)
    for name, field in fields.items():
        default = None if field.default is dataclasses.MISSING else field.default
        assert values[name].help.endswith(field.metadata["help"])
        assert values[name].default == (list(default) if isinstance(default, tuple) else default)
    assert tool.config_from_flags(values) == ClassificationConfig(output_dir="out")
    given = tool_flags("--output_dir=o", "--train=a.csv,b*.csv", "--format=csv",
                       "--valid_fraction=0.25", "--num_shards=3", "--overwrite")
    assert tool.config_from_flags(given) == ClassificationConfig(
        output_dir="o", train=("a.csv", "b*.csv"), format="csv", valid_fraction=0.25,
        num_shards=3, overwrite=True)
    # Every flag under one heading of --help, none left to "other flags".
    grouped = [name for _, names in tool.HELP_GROUPS for name in names]
    assert sorted(grouped) == sorted(fields)


def test_help_opens_with_an_example_and_groups_the_flags():
    shown = run_in_process(TOOL, "--help")
    assert shown.returncode == 0, shown.stderr[-2000:]
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("`tfxl-prepare-classification`:")
    assert any(line.strip().startswith("tfxl-prepare-classification --") for line in lines[:8])
    headings = [line.rstrip(":") for line in lines if re.match(r"^\S.*:$", line)]
    assert headings == [heading for heading, _ in tool.HELP_GROUPS]


def test_the_tool_prepares_what_the_function_prepares(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", DOCUMENTS * 3)
    done = run_in_process(TOOL, f"--train={train}", "--valid_fraction=0.3",
                          "--test_fraction=0.2", "--seed=5", f"--output_dir={tmp_path / 'cli'}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "train:" in done.stderr and done.stdout == ""
    want = prepare_classification(ClassificationConfig(
        output_dir=str(tmp_path / "api"), train=[train], valid_fraction=0.3, test_fraction=0.2,
        seed=5), log=lambda *a: None)
    got = json.loads((tmp_path / "cli" / "manifest.json").read_text())
    assert got["labels"] == want["labels"] == ["book", "code"]
    assert ({s: (v["documents"], v["class_counts"]) for s, v in got["splits"].items()}
            == {s: (v["documents"], v["class_counts"]) for s, v in want["splits"].items()})
    assert got["source"] == want["source"]


def test_bad_inputs_are_one_error_line_and_nothing_is_written(tmp_path):
    out = tmp_path / "out"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a", "label": "x"}\n{"text": "b"}\n')
    assert_one_error_line(run_in_process(TOOL, f"--train={bad}", f"--output_dir={out}"),
                          "bad.jsonl: line 2", "no label")
    good = write_jsonl(tmp_path / "train.jsonl", DOCUMENTS)
    assert_one_error_line(run_in_process(TOOL, f"--train={good}", "--valid_fraction=1.5",
                                         f"--output_dir={out}"), "valid_fraction")
    assert_one_error_line(run_in_process(TOOL, f"--train={good}"), "output_dir is required")
    assert_one_error_line(run_in_process(TOOL, f"--train={good}", "--format=xml",
                                         f"--output_dir={out}"), "format", "xml")
    assert not out.exists()
    made = run_in_process(TOOL, f"--train={good}", "--valid_fraction=0", "--test_fraction=0",
                          f"--output_dir={out}")
    assert made.returncode == 0, made.stderr[-2000:]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert_one_error_line(run_in_process(TOOL, f"--train={good}", f"--output_dir={out}"),
                          str(out))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
