"""Publishing tfxl-prepare's output directory so that no reader ever trusts a half-written result.

Readers (`tfxl.data.manifest.load_manifest`, `input_fn`, `load_tokenizer`) trust only
``manifest.json`` and read only the files it lists, so the manifest is always the last thing
written. How the other files get there depends on the file system (`tfxl.files.is_local`):

* **Local disk** (`StagingDirectory`): everything is written into ``output_dir/.tmp-prepare-<pid>/``
  (the new manifest too, fsynced); at the end (`tfxl.files.StagedDirectory.publish` with
  replace=True) the old manifest (with --overwrite) is removed, files are renamed into place (a
  rename is atomic), the manifest last; then the old data's files
  the new manifest does not list are removed. A killed prepare never leaves a manifest pointing at
  partial shards; its leftover temporary directory is not data and the next prepare into the same
  directory removes it.
* **Object store** such as GCS (`GenerationDirectory`): there is no atomic rename (renaming a
  "directory" copies its objects one by one), so nothing is moved. The run writes its shards and
  vocabulary under a fresh ``output_dir/gen-<UTC time>-<random>/`` that no manifest names, then
  writes ``manifest.json`` (one object, `tfxl.files.write_text_atomically`: it becomes visible
  whole when its writer closes, replacing the old one in one step) naming those files, and only
  then deletes what the old manifest listed and the new one does not, and every other ``gen-*``
  directory. Until the manifest is written the old manifest and all its files are untouched (a
  new directory has no manifest at all); a killed prepare leaves only a ``gen-*`` directory no
  manifest names, which the next prepare removes.
  The token scratch files go to a local temporary directory (`tempfile`), never to the bucket.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import time
from typing import List, Optional

import tfxl.files
from tfxl.data import manifest as manifest_lib
from tfxl.data.errors import DataError
from tfxl.deferred import deferred_import
from tfxl.files import StagedDirectory, fsync_local, listdir, reason, write_text_atomically

tf = deferred_import("tensorflow")  # imported on first use: not by the tools' --help

TMP_PREFIX = ".tmp-prepare-"
GENERATION_PREFIX = "gen-"
# Only names of exactly this form are taken for a run's generation directory (and removed as
# leftovers): a user's own "gen-..." folder is never touched.
_GENERATION = re.compile(r"gen-\d{8}T\d{6}Z-[0-9a-f]{8}")


def open_output_dir(output_dir: str, overwrite: bool):
    """Checks --output_dir (before anything is written) and returns how it is published: a
    `StagingDirectory` on a local file system, a `GenerationDirectory` on any other."""
    if not output_dir:
        raise DataError("--output_dir is required")
    publication = StagingDirectory if tfxl.files.is_local(output_dir) else GenerationDirectory
    return publication(output_dir, overwrite)


class _Publication:
    """The --output_dir checks both ways share. A subclass sets `path` (where prepare writes the
    shards and vocabulary), `scratch` (a local directory for the token files, set by `create`)
    and says which names the manifest lists (`listed`) and which entries are leftovers of a
    killed prepare (`_leftovers`: not data, removed)."""

    path: str
    scratch: Optional[str] = None

    def __init__(self, output_dir: str, overwrite: bool):
        self.output_dir = output_dir
        try:
            self.created = _make_directory(output_dir)
            entries = listdir(output_dir)
            self.old_manifest, known = _old_manifest(output_dir, entries)
            leftovers = self._leftovers(entries, self.old_manifest if known else None, known)
            for entry in leftovers:
                _remove_tree(os.path.join(output_dir, entry))
        except tf.errors.OpError as e:
            raise DataError(f"cannot use --output_dir {output_dir}: "
                            f"{reason(e, output_dir)}") from None
        if [e for e in entries if e not in leftovers] and not overwrite:
            raise DataError(f"--output_dir {output_dir} is not empty; pass --overwrite to replace "
                            "its prepared data")

    def _leftovers(self, entries: List[str], old_manifest: Optional[dict],
                   known: bool) -> List[str]:
        raise NotImplementedError

    def listed(self, name: str) -> str:
        """The manifest's name (relative to output_dir) of a file written as `path`/`name`."""
        raise NotImplementedError

    def _remove_output_dir_if_created_empty(self) -> None:
        try:
            if (self.created and tf.io.gfile.isdir(self.output_dir)
                    and not listdir(self.output_dir)):
                tf.io.gfile.rmtree(self.output_dir)
        except tf.errors.OpError:
            pass  # an empty directory left behind is harmless: the next prepare uses it


class StagingDirectory(_Publication):
    """A local --output_dir: staged in ``.tmp-prepare-<pid>/``, renamed into place, manifest last
    (the module docstring). The token scratch files are staged there too, on the output's disk."""

    def __init__(self, output_dir: str, overwrite: bool):
        super().__init__(output_dir, overwrite)
        self.path = os.path.join(output_dir, f"{TMP_PREFIX}{os.getpid()}")
        self._staged = StagedDirectory(output_dir, "prepare", path=self.path)

    def _leftovers(self, entries, old_manifest, known):
        return [e for e in entries if e.startswith(TMP_PREFIX)]

    def listed(self, name):
        return name

    def create(self) -> None:
        tf.io.gfile.mkdir(self.path)
        self.scratch = self.path

    def discard(self) -> None:
        """Removes the staged files (and `output_dir` when this prepare created it empty)."""
        self._staged.discard()
        self._remove_output_dir_if_created_empty()

    def commit(self, files: List[str], manifest: dict) -> None:
        """Moves `files` into place, manifest last; then removes the old data's leftovers."""
        # Staged first: from the removal of the old manifest on (the directory is "not prepared"
        # until the new one is renamed into place), only renames follow (no new space).
        _write_manifest(os.path.join(self.path, manifest_lib.MANIFEST_NAME), manifest)
        self._staged.publish(last=(manifest_lib.MANIFEST_NAME,), names=files, replace=True)
        if self.old_manifest:
            _remove_unlisted(self.output_dir, self.old_manifest, set(files))
        self._staged.discard()


class GenerationDirectory(_Publication):
    """An --output_dir on an object store: this run's files in a fresh ``gen-<id>/``, the manifest
    written last naming them, the old data removed after it (the module docstring)."""

    def __init__(self, output_dir: str, overwrite: bool):
        super().__init__(output_dir, overwrite)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.generation = f"{GENERATION_PREFIX}{stamp}-{secrets.token_hex(4)}"
        self.path = os.path.join(output_dir, self.generation)
        self.published = False

    def _leftovers(self, entries, old_manifest, known):
        if not known:
            return []   # an unreadable manifest: which generation is its data is unknown
        names = _generations(old_manifest) if old_manifest else set()
        return [e for e in entries if _GENERATION.fullmatch(e) and e not in names]

    def listed(self, name):
        return f"{self.generation}/{name}"

    def create(self) -> None:
        self.scratch = tempfile.mkdtemp(prefix="tfxl-prepare-")
        tf.io.gfile.makedirs(self.path)

    def discard(self) -> None:
        """Before the manifest is written: removes this run's generation (the old data was never
        touched). After it, nothing: the new data is published."""
        if self.scratch:
            _remove_tree(self.scratch)
        if not self.published:
            _remove_tree(self.path)
            self._remove_output_dir_if_created_empty()

    def commit(self, files: List[str], manifest: dict) -> None:
        """Writes the manifest (the one write that publishes), then removes the old data."""
        if not all(name.startswith(f"{self.generation}/") for name in files):
            raise ValueError(f"every file of the manifest must be in {self.generation}/")
        _write_manifest(os.path.join(self.output_dir, manifest_lib.MANIFEST_NAME), manifest)
        self.published = True
        try:
            _remove_unlisted(self.output_dir, self.old_manifest or {}, set(files))
            for entry in listdir(self.output_dir):
                if _GENERATION.fullmatch(entry) and entry != self.generation:
                    _remove_tree(os.path.join(self.output_dir, entry))
        except tf.errors.OpError:
            pass  # published: what is left is named by no manifest, the next prepare removes it
        _remove_tree(self.scratch)


# ------------------------------------------------------------------------------ helpers
def _make_directory(output_dir: str) -> bool:
    """Creates `output_dir` if needed; True when it did."""
    if tf.io.gfile.exists(output_dir) and not tf.io.gfile.isdir(output_dir):
        raise DataError(f"--output_dir {output_dir} exists and is not a directory")
    if tf.io.gfile.isdir(output_dir):
        return False
    try:
        tf.io.gfile.makedirs(output_dir)
    except tf.errors.OpError as e:
        raise DataError(f"--output_dir: cannot create {output_dir}: "
                        f"{reason(e, output_dir)}") from None
    return True


def _old_manifest(output_dir: str, entries: List[str]) -> tuple:
    """(the prepared data's manifest or None, whether what it references is known): a directory
    without a manifest references nothing; an unreadable manifest is unknown."""
    if manifest_lib.MANIFEST_NAME not in entries:
        return None, True
    try:
        return manifest_lib.load_manifest(output_dir, kind=None), True
    except DataError:
        return None, False


def _write_manifest(path: str, manifest: dict) -> None:
    """The staged manifest of a local output (fsynced: it is renamed into place), or the one
    object that publishes an object store's (whole once written)."""
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    if not tfxl.files.is_local(path):
        write_text_atomically(path, text)
        return
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(text)
    fsync_local(path)


def _remove_tree(path: Optional[str]) -> None:
    if path:
        try:
            tf.io.gfile.rmtree(path)
        except tf.errors.OpError:
            pass  # already gone, or not removable: either way not data (module docstring)


def _remove_unlisted(output_dir: str, old_manifest: dict, keep: set) -> None:
    """Removes the files `old_manifest` lists that the new manifest does not (`keep`), and the
    generation directories they leave empty."""
    emptied = set()
    for name in manifest_files(old_manifest):
        path = os.path.join(output_dir, name)
        if name not in keep and tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path):
            tf.io.gfile.remove(path)
            if "/" in name:
                emptied.add(name.split("/")[0])
    for generation in emptied:
        path = os.path.join(output_dir, generation)
        if not listdir(path):
            tf.io.gfile.rmtree(path)


def manifest_files(manifest: dict) -> List[str]:
    """The files a manifest of either kind lists (shards, vocabulary), relative to its directory:
    plain names, or names in a ``gen-*`` directory; anything else (a path leading elsewhere) is
    left alone."""
    names = [s["file"] for split in manifest.get("splits", {}).values()
             for s in split.get("streams", []) + split.get("shards", [])]
    # Imported here: the tokenizers are TensorFlow modules, which tfxl-prepare --help (reading
    # this module for its flags) should not wait for.
    from tfxl.data.tokenizers import spec_files

    names += spec_files(manifest.get("tokenizer", {}))
    return [n for n in names if n and _is_own_name(n)]


def _is_own_name(name: str) -> bool:
    head, _, tail = name.rpartition("/")
    return tail not in ("", ".", "..") and (not head or bool(_GENERATION.fullmatch(head)))


def _generations(manifest: dict) -> set:
    return {name.split("/")[0] for name in manifest_files(manifest) if "/" in name}
