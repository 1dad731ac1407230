"""The one registry of tokenizers (`TOKENIZERS`) and reloading a prepared directory's tokenizer."""

from __future__ import annotations

from typing import Callable, List, Optional

from tfxl.data.errors import DataError
from tfxl.data.manifest import load_manifest
from tfxl.data.tokenizers.base import Tokenizer
from tfxl.data.tokenizers.bytes_tokenizer import BytesTokenizer
from tfxl.data.tokenizers.chars_tokenizer import CharsTokenizer
from tfxl.data.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer
from tfxl.data.tokenizers.wordpiece_tokenizer import WordPieceTokenizer
from tfxl.data.tokenizers.words_tokenizer import WordsTokenizer


# The one registry of tokenizers: kind (``--tokenizer``, the manifest's ``type``) -> class.
TOKENIZERS = {cls.kind: cls for cls in (BytesTokenizer, CharsTokenizer, WordsTokenizer,
                                        WordPieceTokenizer, SentencePieceTokenizer)}


# The keys of a tokenizer spec that name a file (relative to the data directory).
SPEC_FILE_KEYS = ("vocab_file", "model_file")


def spec_files(spec: dict) -> List[str]:
    """The files a tokenizer spec names (words/chars/wordpiece vocabulary, SentencePiece model),
    relative to its data directory."""
    return [spec[key] for key in SPEC_FILE_KEYS if spec.get(key)]


def with_spec_files(spec: dict, rename: Callable[[str], str]) -> dict:
    """`spec` with each file it names renamed by `rename` (tfxl-prepare on an object store lists
    the vocabulary of a run in its own directory: ``gen-<id>/vocab.words.txt``)."""
    return {**spec, **{key: rename(spec[key]) for key in SPEC_FILE_KEYS if spec.get(key)}}


def tokenizer_from_spec(spec: dict, data_dir: str) -> Tokenizer:
    """Rebuilds the tokenizer described by a manifest's ``tokenizer`` entry.

    Vocabulary files are read from `data_dir` and their sha256 must match the
    spec (a `DataError` names the file otherwise).
    """
    kind = spec.get("type")
    if kind not in TOKENIZERS:
        raise DataError(f"unknown tokenizer type {kind!r} "
                        f"(expected one of {', '.join(TOKENIZERS)})")
    return TOKENIZERS[kind].load(spec, data_dir)


def load_tokenizer(data_dir: str, manifest: Optional[dict] = None) -> Tokenizer:
    """The tokenizer a data directory was prepared with."""
    manifest = manifest or load_manifest(data_dir)
    return tokenizer_from_spec(manifest["tokenizer"], data_dir)
