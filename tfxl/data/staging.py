"""The atomic staging directory of `tfxl-prepare`.

Everything is written into ``output_dir/.tmp-prepare-<pid>/``; at the end the new manifest is
staged there too, the old manifest (with --overwrite) is removed, files are renamed into place,
and the manifest is renamed into place last. A killed prepare therefore never leaves a manifest
pointing at partial shards; its leftover temporary directory is not data and the next prepare
into the same directory removes it.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import List, Optional

from tfxl.data import manifest as manifest_lib
from tfxl.data.errors import DataError
from tfxl.data.tokenizers import spec_files

TMP_PREFIX = ".tmp-prepare-"


class StagingDirectory:
    """Checks ``--output_dir`` on construction (before anything is written); `path` is where the
    outputs go until `commit` moves them into place."""

    def __init__(self, output_dir: str, overwrite: bool):
        self.output_dir = output_dir
        self.created, self.old_manifest = _prepare_output_dir(output_dir, overwrite)
        self.path = os.path.join(output_dir, f"{TMP_PREFIX}{os.getpid()}")

    def create(self) -> None:
        os.makedirs(self.path)

    def discard(self) -> None:
        """Removes the staged files (and `output_dir` when this prepare created it empty)."""
        shutil.rmtree(self.path, ignore_errors=True)
        if (self.created and os.path.isdir(self.output_dir)
                and not os.listdir(self.output_dir)):
            os.rmdir(self.output_dir)

    def commit(self, files: List[str], manifest: dict) -> None:
        """Moves `files` into place, manifest last; then removes the old data's leftovers."""
        output_dir, tmp_dir = self.output_dir, self.path
        manifest_path = os.path.join(output_dir, manifest_lib.MANIFEST_NAME)
        # Staged first: from the removal of the old manifest on, only renames follow (no new space).
        staged = os.path.join(tmp_dir, manifest_lib.MANIFEST_NAME)
        with open(staged, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(manifest_path):
            os.remove(manifest_path)   # from here on the directory is "not prepared"
        for name in files:
            os.replace(os.path.join(tmp_dir, name), os.path.join(output_dir, name))
        os.replace(staged, manifest_path)
        if self.old_manifest:
            keep = set(files) | {manifest_lib.MANIFEST_NAME}
            for name in _manifest_files(self.old_manifest):
                if name not in keep and os.path.isfile(os.path.join(output_dir, name)):
                    os.remove(os.path.join(output_dir, name))
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _prepare_output_dir(output_dir: str, overwrite: bool) -> tuple:
    """Validates --output_dir; returns (created, old manifest or None)."""
    if not output_dir:
        raise DataError("--output_dir is required")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise DataError(f"--output_dir {output_dir} exists and is not a directory")
    created = False
    if not os.path.isdir(output_dir):
        try:
            os.makedirs(output_dir)
        except OSError as e:
            raise DataError(f"--output_dir: cannot create {output_dir}: {e.strerror}") from None
        created = True
    # Leftovers of a killed prepare are not data; remove them.
    for entry in os.listdir(output_dir):
        if entry.startswith(TMP_PREFIX):
            shutil.rmtree(os.path.join(output_dir, entry), ignore_errors=True)
    entries = [e for e in os.listdir(output_dir) if not e.startswith(TMP_PREFIX)]
    if entries and not overwrite:
        raise DataError(f"--output_dir {output_dir} is not empty; pass --overwrite to replace "
                        "its prepared data")
    old: Optional[dict] = None
    if entries:
        try:
            old = manifest_lib.load_manifest(output_dir)
        except DataError:
            old = None
    return created, old


def _manifest_files(manifest: dict) -> List[str]:
    names = [s["file"] for split in manifest.get("splits", {}).values()
             for s in split.get("streams", [])]
    spec = manifest.get("tokenizer", {})
    names += spec_files(spec)
    return [n for n in names if n and os.path.basename(n) == n]
