"""A document classification task made from the running Python's standard library, nothing
downloaded: each .py file of a chosen top-level package is a document labelled by its package
(idlelib, encodings, asyncio, ...); every other .py file of the library is the language model's
pretraining corpus, so no file (and no file of a labelled package) is in both.

    task = stdlib_classification_task()          # which files, seeded
    write_labelled_jsonl("docs.jsonl", task)     # {"text", "label", "path"} per line
    # then tfxl.data.classification.prepare_classification(...format="jsonl"...) and
    # tfxl.data.prepare.prepare(PrepareConfig(train=task.lm_train, valid=task.lm_valid, ...))

The benchmark (`benchmarks/classify_bench.py`) and its demo (`make demo-classify`) build their data
with it. A package counts when it has at least `min_documents` files of `min_bytes`..`max_bytes`
(the issue's "2-50 KB": long documents in bytes, none so long that reading it dominates a run);
`max_per_package` draws that many of a large package's files (seeded) so that no class swamps the
others.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sysconfig
from typing import List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tfxl.data.sources import stdlib_files, stdlib_split_of

# Top-level packages of CPython 3.11's Lib/ that hold enough 2-50 KB modules to be a class.
STDLIB_PACKAGES = ("idlelib", "encodings", "distutils", "lib2to3", "ctypes", "unittest",
                   "asyncio", "multiprocessing", "email", "tkinter", "xml", "importlib")


@dataclasses.dataclass(frozen=True)
class StdlibTask:
    """root: the library read. documents: (path relative to root, label) in path order. labels:
    the packages that made a class, in STDLIB_PACKAGES order. lm_train/lm_valid: absolute paths of
    the pretraining corpus (every other .py file, split ~95/5 by tfxl-prepare's stdlib hash)."""

    root: str
    documents: Tuple[Tuple[str, str], ...]
    labels: Tuple[str, ...]
    lm_train: Tuple[str, ...]
    lm_valid: Tuple[str, ...]

    def counts(self) -> dict:
        """label -> number of documents."""
        return {label: sum(1 for _, lab in self.documents if lab == label)
                for label in self.labels}


def _package(relative_path: str) -> Optional[str]:
    parts = relative_path.split(os.sep)
    return parts[0] if len(parts) > 1 else None  # a module at the top is no package's


def stdlib_classification_task(root: Optional[str] = None,
                               packages: Sequence[str] = STDLIB_PACKAGES,
                               min_bytes: int = 2048, max_bytes: int = 50 * 1024,
                               min_documents: int = 10, max_per_package: Optional[int] = None,
                               seed: int = 0) -> StdlibTask:
    """The task over the library at `root` (default: the running Python's). Packages absent or
    with fewer than `min_documents` eligible files are left out (a Python without tkinter still
    gets a task); raises ValueError when fewer than two remain."""
    root = root or sysconfig.get_paths()["stdlib"]
    files = [os.path.relpath(p, root) for p in stdlib_files(root)]
    rng = np.random.default_rng(seed)
    documents, labels = [], []
    for package in packages:
        eligible = [f for f in files if _package(f) == package
                    and min_bytes <= tf.io.gfile.stat(os.path.join(root, f)).length <= max_bytes]
        if len(eligible) < min_documents:
            continue
        if max_per_package and len(eligible) > max_per_package:
            keep = rng.choice(len(eligible), size=max_per_package, replace=False)
            eligible = [eligible[i] for i in sorted(keep)]
        labels.append(package)
        documents.extend((f, package) for f in eligible)
    if len(labels) < 2:
        raise ValueError(f"{root}: fewer than two of the packages {', '.join(packages)} have "
                         f"{min_documents} files of {min_bytes}-{max_bytes} bytes")
    # Whole labelled packages stay out of the corpus, not only the files drawn: the language
    # model never reads a test document, nor its package's other modules.
    corpus = [f for f in files if _package(f) not in labels]
    lm = {"train": [], "valid": []}
    for f in corpus:  # tfxl-prepare's own stdlib split; its test share joins train
        lm["valid" if stdlib_split_of(f) == "valid" else "train"].append(os.path.join(root, f))
    return StdlibTask(root, tuple(sorted(documents)), tuple(labels), tuple(lm["train"]),
                      tuple(lm["valid"]))


def write_labelled_jsonl(path: str, task: StdlibTask) -> List[str]:
    """Writes the task's documents as JSON lines {"text", "label", "path"} (tfxl-prepare-
    classification's jsonl format) and returns the files skipped for not being UTF-8."""
    skipped, lines = [], []
    for relative, label in task.documents:
        with tf.io.gfile.GFile(os.path.join(task.root, relative), "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(relative)
            continue
        lines.append(json.dumps({"text": text, "label": label, "path": relative}))
    with tf.io.gfile.GFile(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return skipped
