"""Checkpoint readers; none needs torch.

Every reader returns a `TensorSource`: the tensor names with their shapes, and `get(name)` that
loads one tensor as a numpy array (lazily where the format allows, so optimizer slots and other
unused tensors of a large checkpoint are never read).

Formats:
  * torch.save zip files (`.bin`, `.pt`, `.pth`): `<root>/data.pkl` + `<root>/data/<key>` raw
    storages. The pickle is read by `RestrictedUnpickler`, which resolves only the handful of
    globals a tensor state dict needs (the tensor rebuild functions, storage types,
    OrderedDict) to local numpy builders and refuses every other global, so a malicious pickle
    cannot run code.
  * `.safetensors`: the `safetensors` package's numpy API (the optional `convert` extra).
  * `.npz`: numpy archives (no pickled objects allowed).
  * TF1 checkpoints (a prefix such as `model.ckpt-0`, or a directory): `tf.train.load_checkpoint`.

Any path may be a bucket (gs://...): `open_checkpoint` reads through tf.io.gfile, and copies a
remote torch, safetensors or npz file to a local temporary file first (TF1 checkpoints are read
by TensorFlow from the bucket itself).
"""

from __future__ import annotations

import collections
import io
import math
import os
import pickle
import re
import tempfile
import zipfile

import numpy as np

from tfxl.cli import one_line
from tfxl.convert.errors import ConversionError
from tfxl.deferred import deferred_import
from tfxl.files import is_local

tf = deferred_import("tensorflow")  # imported on first use: not by tfxl-convert --help


class TensorSource:
    """Names -> shapes, plus lazy loading of individual tensors."""

    def __init__(self, shapes, loader, description=""):
        self.shapes = {str(k): tuple(int(d) for d in v) for k, v in shapes.items()}
        self._loader = loader
        self.description = description
        self.local_copy = None  # a remote file's local copy, kept while tensors may be read

    def __contains__(self, name):
        return name in self.shapes

    def names(self):
        return list(self.shapes)

    def get(self, name) -> np.ndarray:
        if name not in self.shapes:
            raise KeyError(name)
        return np.asarray(self._loader(name))

    @classmethod
    def from_arrays(cls, arrays, description=""):
        arrays = {str(k): np.asarray(v) for k, v in arrays.items()}
        return cls({k: v.shape for k, v in arrays.items()}, arrays.__getitem__, description)


# ------------------------------------------------------------------------------------------------
# bfloat16 has no numpy dtype: read it as uint16 and widen to float32 (exact).
def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


# torch storage class name -> (numpy dtype of the raw bytes, is bfloat16)
_TORCH_STORAGES = {
    "FloatStorage": (np.dtype("<f4"), False),
    "DoubleStorage": (np.dtype("<f8"), False),
    "HalfStorage": (np.dtype("<f2"), False),
    "BFloat16Storage": (np.dtype("<u2"), True),
    "LongStorage": (np.dtype("<i8"), False),
    "IntStorage": (np.dtype("<i4"), False),
    "ShortStorage": (np.dtype("<i2"), False),
    "CharStorage": (np.dtype("i1"), False),
    "ByteStorage": (np.dtype("u1"), False),
    "BoolStorage": (np.dtype("?"), False),
}


class _StorageType:
    """Stands in for `torch.FloatStorage` & co. inside the pickle."""

    def __init__(self, name):
        self.name = name
        self.dtype, self.bfloat16 = _TORCH_STORAGES[name]


class _Storage:
    """One raw storage of the archive, read on first use."""

    def __init__(self, archive, key, storage_type, numel, byteorder):
        self.archive, self.key, self.type, self.numel = archive, key, storage_type, numel
        self.byteorder = byteorder
        self._array = None

    def array(self) -> np.ndarray:
        if self._array is None:
            raw = self.archive.read_storage(self.key)
            dtype = self.type.dtype
            if self.byteorder == "big":
                dtype = dtype.newbyteorder(">")
            if len(raw) % dtype.itemsize:
                raise ConversionError(f"{self.archive.path}: storage {self.key} has {len(raw)} "
                                      f"bytes, not a multiple of {dtype.itemsize}")
            array = np.frombuffer(raw, dtype=dtype)
            if self.numel is not None and array.size < self.numel:
                raise ConversionError(f"{self.archive.path}: storage {self.key} holds "
                                      f"{array.size} elements, the pickle says {self.numel}")
            self._array = array
        return self._array


class _LazyTensor:
    """A strided view into a storage, materialised (and bounds-checked) on demand."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset = storage, int(offset)
        self.shape = tuple(int(s) for s in size)
        self.stride = tuple(int(s) for s in stride)
        # Refused where the tensor's name is known (`_state_dict_source`): the unpickler
        # rebuilds a tensor before the dict that names it.
        self.problem = None
        if len(self.shape) != len(self.stride) or any(s < 0 for s in self.shape + self.stride):
            self.problem = f"bad tensor geometry size={size} stride={stride}"
        elif self.offset < 0:
            self.problem = f"bad tensor storage offset {offset}"

    @property
    def extent(self) -> int:
        """The elements of its storage this tensor reaches: the last one it reads, plus one."""
        if 0 in self.shape:
            return 0
        return self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.stride)) + 1

    def numpy(self) -> np.ndarray:
        flat = self.storage.array()
        if 0 in self.shape:
            out = np.zeros(self.shape, flat.dtype)
        else:
            last = self.extent - 1
            if last >= flat.size:
                raise ConversionError(f"tensor reads past the end of storage {self.storage.key} "
                                      f"(needs element {last}, storage has {flat.size})")
            base = flat[self.offset:]
            out = np.lib.stride_tricks.as_strided(
                base, shape=self.shape, strides=[s * flat.itemsize for s in self.stride],
                writeable=False).copy()
        if self.storage.type.bfloat16:
            out = _bf16_to_f32(out)
        return out.astype(out.dtype.newbyteorder("=")) if out.dtype.byteorder == ">" else out


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):
    if not isinstance(storage, _Storage):
        raise ConversionError("malformed torch pickle: a tensor without a storage")
    return _LazyTensor(storage, storage_offset, size, stride)


def _rebuild_tensor(storage, storage_offset, size, stride):
    return _rebuild_tensor_v2(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None):
    return data


def _rebuild_parameter_with_state(data, requires_grad=False, backward_hooks=None, state=None):
    return data


# The complete list of globals a state dict pickle may name.
_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter_with_state,
    **{("torch", name): _StorageType(name) for name in _TORCH_STORAGES},
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles a torch state dict; refuses every global outside `_ALLOWED`."""

    def __init__(self, file, archive, byteorder="little"):
        super().__init__(file)
        self._archive = archive
        self._byteorder = byteorder
        self._storages = {}

    def find_class(self, module, name):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise ConversionError(
                f"refusing to unpickle global {module}.{name}: only tensor state dicts are "
                f"allowed (torch.save(model.state_dict(), ...), not a whole pickled model or "
                f"arbitrary objects)") from None

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 4 and pid[0] == "storage"):
            raise ConversionError(f"unsupported persistent id in torch pickle: {pid!r:.80}")
        storage_type, key = pid[1], str(pid[2])
        numel = pid[4] if len(pid) > 4 else None
        if not isinstance(storage_type, _StorageType):
            raise ConversionError(f"unsupported storage type in torch pickle: {storage_type!r:.80}")
        if key not in self._storages:
            self._storages[key] = _Storage(self._archive, key, storage_type, numel,
                                           self._byteorder)
        return self._storages[key]


class _TorchArchive:
    def __init__(self, path, name):
        self.path = name  # what messages call it (the user's path, not a local copy)
        try:
            self.zip = zipfile.ZipFile(path)
        except zipfile.BadZipFile:
            raise ConversionError(
                f"{name}: not a torch zip checkpoint (files written by torch.save with torch >= "
                f"1.6; re-save older files with torch.save(state_dict, path))") from None
        pickles = [n for n in self.zip.namelist() if n.endswith("data.pkl")
                   and n.count("/") == 1]
        if len(pickles) != 1:
            raise ConversionError(f"{name}: expected one <root>/data.pkl in the torch zip, found "
                                  f"{len(pickles)}")
        self.root = pickles[0][: -len("data.pkl")]

    def read(self, member):
        return self.zip.read(self.root + member)

    def read_storage(self, key):
        return self.zip.read(self._storage_info(key))

    def storage_bytes(self, key):
        """The size storage `key` declares in the zip directory, known before it is inflated
        (zipfile never inflates a member past it)."""
        return self._storage_info(key).file_size

    def _storage_info(self, key):
        try:
            return self.zip.getinfo(f"{self.root}data/{key}")
        except KeyError:
            raise ConversionError(f"{self.path}: storage data/{key} is missing from the "
                                  f"archive") from None


def read_torch_zip(path, name=None) -> TensorSource:
    """A torch zip file; `name` (default `path`) is what messages call it."""
    name = name or path
    archive = _TorchArchive(path, name)
    byteorder = "little"
    if archive.root + "byteorder" in archive.zip.namelist():
        byteorder = archive.read("byteorder").decode("ascii", "replace").strip() or "little"
    unpickler = RestrictedUnpickler(io.BytesIO(archive.read("data.pkl")), archive, byteorder)
    try:
        obj = unpickler.load()
    except ConversionError:
        raise
    except Exception as e:  # truncated/garbled pickles raise all sorts of things
        raise ConversionError(f"{name}: cannot read data.pkl ({type(e).__name__}: {e})") from None
    return _state_dict_source(obj, name)


def _state_dict_source(obj, path):
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]  # a {"state_dict": ...} wrapper (common training checkpoints)
    if not isinstance(obj, dict):
        raise ConversionError(f"{path}: the pickle holds a {type(obj).__name__}, not a state "
                              f"dict of tensors")
    tensors = {}
    for name, value in obj.items():
        if isinstance(value, _LazyTensor):
            if value.problem:
                raise ConversionError(f"{path}: tensor {name!r}: {value.problem}")
            tensors[str(name)] = value
        elif not isinstance(value, (int, float, str, bool, type(None), dict)):
            raise ConversionError(f"{path}: entry {name!r} is a {type(value).__name__}, not a "
                                  f"tensor")
    _check_storage_sizes(tensors, path)
    return TensorSource({k: v.shape for k, v in tensors.items()},
                        lambda name: tensors[name].numpy(), f"torch zip {path}")


def _check_storage_sizes(tensors, path):
    """Every storage's declared size against what its tensors reach, before any is inflated:
    torch.save writes each storage whole, so a larger one (a small tensor whose deflated storage
    inflates to gigabytes) is refused, as is a smaller one (a tensor reading past its end)."""
    on_storage = collections.defaultdict(list)
    for name, tensor in tensors.items():
        on_storage[tensor.storage].append(name)
    for storage, names in on_storage.items():
        itemsize = storage.type.dtype.itemsize
        declared = storage.archive.storage_bytes(storage.key)
        widest = max(names, key=lambda n: tensors[n].extent)
        need = tensors[widest].extent * itemsize
        tensor = f"tensor {widest!r} {list(tensors[widest].shape)}"
        if declared < need:
            raise ConversionError(f"{path}: {tensor} reads past the end of storage "
                                  f"{storage.key} (it needs {need} bytes, the storage holds "
                                  f"{declared})")
        if declared > need:
            raise ConversionError(f"{path}: storage {storage.key} declares {declared} bytes but "
                                  f"the tensors on it need {need} ({tensor}"
                                  f"{f' and {len(names) - 1} more' if len(names) > 1 else ''});"
                                  " refusing to inflate it")


# ------------------------------------------------------------------------------------------------
SAFETENSORS_MISSING = ("reading .safetensors files needs the safetensors package: "
                       "pip install '.[convert]' in a clone of tfxl")


def read_safetensors(path, name=None) -> TensorSource:
    """A `.safetensors` file through the `safetensors` package's numpy API (no torch).

    The header (names, dtypes, shapes) is read up front and validated by the library; each
    tensor is read when asked for. bfloat16 tensors are widened to float32 (exact). `name`
    (default `path`) is what messages call it.
    """
    name = name or path
    # Imported here: the library works without the optional package until a file needs it.
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:
        raise ConversionError(f"{name}: {SAFETENSORS_MISSING}") from None
    # Registers numpy's bfloat16, which safetensors' numpy API needs for BF16 tensors (ml_dtypes
    # comes with TensorFlow).
    import ml_dtypes

    def opened():
        try:
            return safe_open(path, framework="np")
        except SafetensorError as e:
            raise ConversionError(f"{name}: not a valid safetensors file ({one_line(e)})") \
                from None

    with opened() as f:
        shapes = {name: f.get_slice(name).get_shape() for name in f.keys()}

    def load(name):
        with opened() as f:
            array = f.get_tensor(name)
        return array.astype(np.float32) if array.dtype == ml_dtypes.bfloat16 else array

    return TensorSource(shapes, load, f"safetensors {name}")


# Deflate inflates at most ~1032:1; a member whose stated size is beyond that is damaged.
_DEFLATE_MAX_RATIO = 1100


def _npy_header(archive, info, name):
    """(shape, dtype, fortran_order) of the .npy member `info`, from its header alone; checked
    against the bytes the member holds, so that loading it allocates no more than that."""
    member = info.filename
    try:
        with archive.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f".npy format version {version[0]}.{version[1]} is not read here")
            header_len = f.tell()
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise ConversionError(f"{name}: {member} is not a .npy array ({one_line(e)})") from None
    if dtype.hasobject:
        raise ConversionError(f"{name}: {member} holds Python objects (pickles are not read)")
    if (info.compress_type != zipfile.ZIP_STORED
            and info.file_size > _DEFLATE_MAX_RATIO * info.compress_size + 2**16):
        raise ConversionError(f"{name}: {member} states {info.file_size} bytes inflated from "
                              f"{info.compress_size}, more than deflate gives: a damaged archive")
    need = math.prod(shape) * dtype.itemsize
    holds = info.file_size - header_len
    if need != holds:
        raise ConversionError(
            f"{name}: {member} declares shape {tuple(shape)} {dtype.name}, {need} bytes, but "
            f"holds {holds}: a damaged or forged .npy header")
    return shape, dtype


def read_npz(path, name=None) -> TensorSource:
    """A numpy .npz archive; `name` (default `path`) is what messages call it.

    Each array's shape comes from its .npy header (nothing is loaded to learn it) and is
    checked against the bytes the member holds before anything is read; a member that is not
    .npy, or holds pickled objects, is a ConversionError naming it.
    """
    name = name or path
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError) as e:
        raise ConversionError(f"{name}: cannot read as .npz ({one_line(e)})") from None
    shapes, members = {}, {}
    for info in archive.infolist():
        if info.is_dir():
            continue
        if not info.filename.endswith(".npy"):
            raise ConversionError(f"{name}: member {info.filename!r} is not a .npy array (an "
                                  ".npz holds .npy files only)")
        key = info.filename[:-len(".npy")]
        shapes[key], _ = _npy_header(archive, info, name)
        members[key] = info

    def load(key):
        with archive.open(members[key]) as f:
            return np.lib.format.read_array(f, allow_pickle=False)

    source = TensorSource(shapes, load, f"npz {name}")
    source.archive = archive  # open as long as the source: tensors are read lazily
    return source


def read_tf1(path) -> TensorSource:
    path = str(path)
    for suffix in (".index", ".meta"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
    path = re.sub(r"\.data-\d{5}-of-\d{5}$", "", path)
    try:
        reader = tf.train.load_checkpoint(str(path))
    except (ValueError, tf.errors.OpError) as e:
        raise ConversionError(f"{path}: cannot open as a TF checkpoint "
                              f"({' '.join(str(e).split())[:200]})") from None
    shapes = reader.get_variable_to_shape_map()
    return TensorSource(shapes, reader.get_tensor, f"TF checkpoint {path}")


def open_checkpoint(path, kind="auto") -> TensorSource:
    """Opens `path` as `kind` (torch | safetensors | npz | tf1 | auto: by suffix/content); any
    tf.io.gfile path (gs://...)."""
    path = os.fspath(path)
    if kind == "auto":
        kind = sniff(path)
    readers = {"torch": read_torch_zip, "safetensors": read_safetensors, "npz": read_npz,
               "tf1": read_tf1}
    if kind not in readers:
        raise ConversionError(f"unknown checkpoint file kind {kind!r}")
    if kind == "tf1":  # TensorFlow reads its checkpoints through gfile itself
        return read_tf1(path)
    if tf.io.gfile.isdir(path):
        raise ConversionError(f"{path} is a directory, not a {kind} checkpoint file")
    if not tf.io.gfile.exists(path):
        raise ConversionError(f"{path}: no such file")
    if is_local(path):
        return readers[kind](path)
    # zipfile seeks all over the file, safetensors maps it into memory and np.load wants a real
    # file: a remote checkpoint is copied to a local temporary file first, which lives as long
    # as the TensorSource (its tensors are read lazily) and is removed with it.
    copy = tempfile.TemporaryDirectory(prefix="tfxl-convert-")
    local = os.path.join(copy.name, os.path.basename(path))
    tf.io.gfile.copy(path, local)
    source = readers[kind](local, name=path)
    source.local_copy = copy
    return source


def sniff(path) -> str:
    if (tf.io.gfile.isdir(path) or not tf.io.gfile.exists(path)
            or re.search(r"\.(index|meta|data-\d{5}-of-\d{5})$", path)):
        return "tf1"
    lower = path.lower()
    if lower.endswith(".safetensors"):
        return "safetensors"
    if lower.endswith(".npz"):
        return "npz"
    with tf.io.gfile.GFile(path, "rb") as f:
        magic = f.read(4)
    if magic == b"PK\x03\x04":
        return "npz" if lower.endswith(".npz") else "torch"
    if lower.endswith((".bin", ".pt", ".pth", ".ckpt")):
        return "torch"
    return "safetensors"
