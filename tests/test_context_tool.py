"""tfxl-context: a group's losses by context, its RECL table, context.json and context.png."""

import json

import numpy as np
import pytest

from factories import assert_one_error_line, random_bytes_data, run_in_process, tiny_lm
from tfxl.analysis import context_losses, recl, target_positions
from tfxl.data.split_tokens import split_tokens

TOOL = "tfxl.analysis.context_main"


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """A data dir and two .keras models of its vocabulary: one reads on a memory, one without."""
    root = tmp_path_factory.mktemp("context")
    data_dir = random_bytes_data(root, tgt_len=8, num_streams=2)
    paths = []
    for name, mem_len in (("memory", 8), ("none", 0)):
        model = tiny_lm(vocab_size=258, tgt_len=4, mem_len=mem_len)
        model.save(root / f"{name}.keras")
        paths.append(str(root / f"{name}.keras"))
    return data_dir, paths


def flags_of(data_dir, paths, out, *extra):
    return [*(f"--model={p}" for p in paths), f"--data_dir={data_dir}", "--contexts=4,8,12",
            "--positions=12", "--batch_size=5", f"--output_dir={out}", *extra]


def test_the_group_is_read_and_its_recl_table_written(group, tmp_path):
    data_dir, paths = group
    result = run_in_process(TOOL, *flags_of(data_dir, paths, tmp_path / "out", "--r=0.5,1"))
    assert result.returncode == 0, result.stderr
    written = json.loads((tmp_path / "out" / "context.json").read_text())
    assert written["contexts"] == [4, 8, 12] and written["positions"] == 12
    assert list(written["models"]) == paths
    assert (tmp_path / "out" / "context.png").read_bytes()[:4] == b"\x89PNG"
    # The same numbers as the library's, on the same targets.
    import keras
    tokens = split_tokens(data_dir, "valid")
    positions = target_positions(tokens.size, 12, 12, seed=0)
    losses = {p: context_losses(keras.saving.load_model(p), tokens, positions, [4, 8, 12])
              for p in paths}
    for r in (0.5, 1.0):
        for path, value in recl(losses, [4, 8, 12], r).items():
            assert written["models"][path]["recl"][f"{r:g}"] == value
    for path in paths:
        entry = written["models"][path]
        assert entry["architecture"] == "transformer_xl"
        np.testing.assert_allclose(entry["loss"], losses[path].mean(axis=1), rtol=1e-6)
    assert "RECL on valid: 12 targets, contexts 4..12 step 4" in result.stdout
    assert all(p in result.stdout for p in paths)
    # Kept, not overwritten, without --overwrite.
    again = run_in_process(TOOL, *flags_of(data_dir, paths, tmp_path / "out"))
    assert_one_error_line(again, "context.json exists; pass --overwrite")


@pytest.mark.parametrize("change, needle", [
    (["--contexts=4,8,16"], "--contexts: at least two contexts >= 1, increasing with one step"),
    (["--contexts=8,4"], "--contexts: at least two"),
    (["--contexts=4,x"], "--contexts: integers"),
    (["--r=0"], "--r: fractions in (0, 1]"),
    (["--positions=1999"], "positions: 1999 asked, but the split has 1988 targets"),
    (["--batch_size=1000000"], "lower --batch_size"),
    (["--split=dev"], "split 'dev' is not in the manifest"),
])
def test_a_bad_flag_is_one_error_line(group, tmp_path, change, needle):
    data_dir, paths = group
    result = run_in_process(TOOL, *flags_of(data_dir, paths, tmp_path / "out"), *change)
    assert_one_error_line(result, needle)
    assert not (tmp_path / "out").exists()


def test_models_of_other_vocabularies_or_unknown_paths_are_refused(group, tmp_path):
    data_dir, paths = group
    other = tiny_lm(vocab_size=300, tgt_len=4, mem_len=8)
    other.save(tmp_path / "other.keras")
    result = run_in_process(TOOL, *flags_of(data_dir, [paths[0], tmp_path / "other.keras"],
                                            tmp_path / "out"))
    assert_one_error_line(result, "a group reads one vocabulary")
    result = run_in_process(TOOL, *flags_of(data_dir, [tmp_path / "missing"], tmp_path / "out"))
    assert_one_error_line(result, "missing")
    assert not (tmp_path / "out" / "context.json").exists()


def test_the_reading_shows_a_progress_bar_on_a_terminal_only():
    import io

    from tfxl.analysis.context_main import progress_bar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert progress_bar(io.StringIO()) is None  # a log or a pipe: quiet
    shown = Terminal()
    progress = progress_bar(shown)
    progress(400, 1000)
    progress(1000, 1000)
    assert "1000/1000" in shown.getvalue(), shown.getvalue()
