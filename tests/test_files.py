"""tfxl.files: which paths are local, copying a tree with some names last, publishing a staged
directory whole, and checking an output path before the work."""

import os

import pytest
import tensorflow as tf

import tfxl.files
from tfxl.files import StagedDirectory, check_writable, copy_tree, is_local, list_files


def test_only_plain_paths_and_file_urls_are_local():
    for path in ("runs/x", "/abs/x", "file:///abs/x", "FILE:///x", "./a://b", "c:dir"):
        assert is_local(path), path
    for path in ("gs://bucket/x", "s3://b/x", "ram://x", "hdfs://host/x", "GS://b"):
        assert not is_local(path), path


def make_tree(root):
    for relative in ("saved_model.pb", "a/b/c.txt", "fingerprint.pb", "a/d.txt"):
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(relative)


def test_copy_tree_copies_every_file_with_the_last_names_last(tmp_path):
    make_tree(tmp_path / "src")
    order = copy_tree(str(tmp_path / "src"), str(tmp_path / "dst"),
                      last=("saved_model.pb", "missing.pb"))
    assert order == ["a/b/c.txt", "a/d.txt", "fingerprint.pb", "saved_model.pb"]
    assert list_files(str(tmp_path / "dst")) == sorted(order)
    assert (tmp_path / "dst" / "a" / "b" / "c.txt").read_text() == "a/b/c.txt"
    with pytest.raises(tf.errors.AlreadyExistsError):
        copy_tree(str(tmp_path / "src"), str(tmp_path / "dst"))


@pytest.mark.parametrize("local", [True, False], ids=["local", "object store"])
def test_staged_directory_publishes_whole_and_never_over_anything(tmp_path, monkeypatch, local):
    if not local:
        monkeypatch.setattr(tfxl.files, "is_local", lambda path: False)
    final = tmp_path / "out" / "1"
    (tmp_path / "out").mkdir()
    with StagedDirectory(str(final), "export") as staged:
        assert os.path.basename(staged.path).startswith(".tmp-export-1-")
        assert (os.path.dirname(staged.path) == str(tmp_path / "out")) == local
        make_tree(staged.path)
        assert not final.exists()
        staged.publish(last=("saved_model.pb",))
    assert list_files(str(final)) == ["a/b/c.txt", "a/d.txt", "fingerprint.pb", "saved_model.pb"]
    assert os.listdir(tmp_path / "out") == ["1"]  # nothing of the temporary name is left
    with StagedDirectory(str(final), "export") as staged:
        make_tree(staged.path)
        with pytest.raises(FileExistsError):
            staged.publish()
    assert os.listdir(tmp_path / "out") == ["1"]
    (tmp_path / "out" / "2").mkdir()  # an empty directory may be published into
    with StagedDirectory(str(tmp_path / "out" / "2"), "export") as staged:
        make_tree(staged.path)
        staged.publish()
    assert len(list_files(str(tmp_path / "out" / "2"))) == 4


def test_a_failed_block_leaves_nothing_behind(tmp_path):
    with pytest.raises(RuntimeError):
        with StagedDirectory(str(tmp_path / "v"), "export") as staged:
            make_tree(staged.path)
            raise RuntimeError("killed")
    assert os.listdir(tmp_path) == []


def test_check_writable_names_the_path(tmp_path, monkeypatch):
    check_writable(str(tmp_path / "out.json"), "--output")
    assert os.listdir(tmp_path) == []  # the probe is gone
    with pytest.raises(ValueError, match="does not exist"):
        check_writable(str(tmp_path / "no" / "out.json"), "--output")
    with pytest.raises(ValueError, match="is a directory"):
        check_writable(str(tmp_path), "--output")
    monkeypatch.chdir(tmp_path)
    check_writable("ram://files-test/out.json", "--output")  # a bucket: no directories to check
    assert os.listdir(tmp_path) == []


def test_two_writers_in_one_process_replace_a_file_without_losing_either_write(tmp_path,
                                                                                monkeypatch):
    """Two threads (two Runners' leases in one process) write the same file at once: each
    writes its own temporary file (one per process was shared, and the second rename found it
    gone: NotFoundError), and the file ends as one of the two texts."""
    import threading
    both_written = threading.Barrier(2, timeout=30)
    rename = tf.io.gfile.rename

    def rename_after_both_wrote(src, dst, overwrite=False):
        both_written.wait()
        rename(src, dst, overwrite=overwrite)

    monkeypatch.setattr(tf.io.gfile, "rename", rename_after_both_wrote)
    path, failures = str(tmp_path / "lease.json"), []

    def write(text):
        try:
            tfxl.files.write_text_atomically(path, text)
        except Exception as err:  # reported below, with the thread's text
            failures.append(f"{text}: {err!r}")

    threads = [threading.Thread(target=write, args=(text,)) for text in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    assert open(path).read() in ("a", "b") and os.listdir(tmp_path) == ["lease.json"]


def watch(monkeypatch, *names):
    """The tf.io.gfile calls `names` made from now on, as (name, last argument's path)."""
    events = []
    for name in names:
        def logged(*args, _call=getattr(tf.io.gfile, name), _name=name, **kwargs):
            events.append((_name, os.fspath(args[1] if len(args) > 1 else args[0])))
            return _call(*args, **kwargs)
        monkeypatch.setattr(tf.io.gfile, name, logged)
    return events


@pytest.mark.parametrize("local", [True, False], ids=["local", "object store"])
def test_staged_files_replace_their_namesakes_the_trusted_one_removed_first_and_put_last(
        tmp_path, monkeypatch, local):
    """publish(replace=True): the old trusted file goes before anything else changes and the
    new one comes last, so no reader combines the old files with the new; the files the staged
    tree does not hold stay."""
    final = tmp_path / "preset"
    final.mkdir()
    for name, text in (("config.json", "old"), ("a.txt", "old"), ("keep.txt", "old")):
        (final / name).write_text(text)
    if local:
        (tmp_path / ".tmp-preset").mkdir()
        where = {"path": str(tmp_path / ".tmp-preset")}
    else:
        where = {"scratch": "tfxl-test-", "local": False}
    with StagedDirectory(str(final), "preset", **where) as staged:
        scratch = staged.path
        assert os.path.isdir(scratch) and scratch.startswith(str(tmp_path)) == local
        for name in ("config.json", "a.txt", "sub/b.txt"):
            os.makedirs(os.path.dirname(os.path.join(scratch, name)), exist_ok=True)
            with open(os.path.join(scratch, name), "w") as f:
                f.write("new")
        events = watch(monkeypatch, "remove", "rename", "copy")
        staged.publish(last=("config.json", "missing.json"), replace=True)
    config = str(final / "config.json")
    moved = "rename" if local else "copy"
    assert events[0] == ("remove", config) and events[-1] == (moved, config)
    assert [kind for kind, _ in events] == ["remove"] + [moved] * 3
    assert {name: (final / name).read_text() for name in list_files(str(final))} == {
        "a.txt": "new", "config.json": "new", "keep.txt": "old", "sub/b.txt": "new"}
    assert not os.path.exists(scratch)


def test_staged_names_only_are_published_and_a_tree_without_the_trusted_file_keeps_it(tmp_path):
    final = tmp_path / "data"
    final.mkdir()
    (final / "manifest.json").write_text("old")
    staging = final / ".tmp-prepare-1"
    staging.mkdir()
    for name in ("shard", "scratch.bin"):
        (staging / name).write_text("new")
    staged = StagedDirectory(str(final), "prepare", path=str(staging))
    staged.publish(last=("manifest.json",), names=["shard"], replace=True)
    assert (final / "manifest.json").read_text() == "old" and (final / "shard").exists()
    assert sorted(os.listdir(staging)) == ["scratch.bin"]
    staged.discard()
    assert sorted(os.listdir(final)) == ["manifest.json", "shard"]


@pytest.mark.parametrize("local", [True, False], ids=["local", "object store"])
def test_one_staged_file_is_published_whole(tmp_path, monkeypatch, local):
    if not local:
        monkeypatch.setattr(tfxl.files, "is_local", lambda path: False)
    final = tmp_path / "model.keras"
    final.write_text("old")
    with StagedDirectory(str(final), "classifier", scratch="tfxl-test-") as staged:
        with open(os.path.join(staged.path, "model.keras"), "w") as f:
            f.write("new")
        events = watch(monkeypatch, "rename")
        staged.publish_file("model.keras")
    assert final.read_text() == "new" and os.listdir(tmp_path) == ["model.keras"]
    assert [kind for kind, _ in events] == (["rename"] if local else [])  # one object write
    assert not os.path.exists(staged.path)
