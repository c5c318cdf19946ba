"""NVIDIA's StyleGAN2 pickles read as data: their networks become ours without running anything from the file.

StyleGAN2-ADA PyTorch (github.com/NVlabs/stylegan2-ada-pytorch) and the StyleGAN3 repository (its StyleGAN2
networks) write `network-snapshot-*.pkl` with pickle.dump of a dict: `G`, `D`, `G_ema`, `augment_pipe` and
`training_set_kwargs`. Their networks are classes decorated by their torch_utils/persistence.py, which
pickles each object as a call of `torch_utils.persistence._reconstruct_persistent_obj` on a dict

    {type: 'class', version: int, module_src: <source of the whole module>, class_name: str, state: obj.__dict__}

and unpickling it the usual way exec()s `module_src`. Here the file goes through a restricted unpickler
whose only globals are this module's own stand-ins (`_GLOBALS`): a persistent object becomes a record of
its meta dict; `dnnlib.util.EasyDict`, `collections.OrderedDict` and `builtins.set` plain containers; NumPy
scalars (their layers keep gains as numpy.float64) numbers of a numeric dtype; and a tensor, which a plain
pickle holds as `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)` over a storage
pickled as `torch.storage._load_from_bytes(<a legacy torch.save of the storage>)`, is read from those bytes
here (their layout: pickles of the magic number, protocol 1001 and sys_info, the storage's persistent id
('storage', torch.<T>Storage, key, location, numel), the list of keys, then per key an int64 element count
and the raw little-endian elements). Any other global, a persistent id, or state set on a record is
refused: `NvidiaPickleError`, one line, nothing of the file run.

The embedded source is never compiled or run: it is parsed (ast.parse, at most MAX_SOURCE_CHARS) only to
tell which of NVIDIA's modules it is, by the persistent classes it defines, since the pickle records no
module name:

    training.networks            StyleGAN2-ADA: the StyleGAN2 classes, Generator(..., synthesis_kwargs={})
    training.networks_stylegan2  StyleGAN3 repository: the same classes, Generator(..., **synthesis_kwargs)
    training.networks_stylegan3  StyleGAN3 repository, alias-free (it defines SynthesisInput): not StyleGAN2
    training.augment             both: AugmentPipe

`G`, `D` and `G_ema` must be the Generator or Discriminator of the first two (NETWORKS), and every layer
inside them a persistent class of the same source. Their constructor kwargs (`_init_kwargs`; positional
`_init_args` are refused) are rewritten for training/networks/stylegan2.py, whose Generator and
Discriminator take StyleGAN2-ADA's kwargs: the StyleGAN3 repository's Generator takes the synthesis kwargs
flat, and its defaults differ (_STYLEGAN3_DEFAULTS, made explicit). The state dict is gathered from the records'
`_parameters`, `_buffers` (less `_non_persistent_buffers_set`) and `_modules`, as module.state_dict()
would, and the network is rebuilt through persistence.rebuild_network: our class allow-list, the kwargs
checked against the class, shapes compared on the meta device, the tensors loaded strictly.
`augment_pipe` (we have no such pipeline) is dropped with one line; so are `training_set_kwargs` that do
not describe a dataset of ours (NVIDIA's ImageFolderDataset takes the same kwargs as ours) and any other
entry.

Memory (torch_utils/bounded_read.py's bound, MEMORY_FACTOR x file size + MEMORY_ALLOWANCE): the file is
read whole (1x), passes bounded_read.check_pickle (opcodes and memo, so the objects it makes stay within the
allowance) and unpickles; the storages' bytes live in the unpickler (1x) while each is copied into its
tensor (1x), and only after its declared element count was found within those bytes (the five small
pickles before them at most MAX_STORAGE_OPCODES opcodes each). A tensor must lie within its storage
without broadcast strides. Sources are parsed one at a time, their syntax trees dropped at once (at most
~60 MiB for MAX_SOURCE_CHARS). After unpickling only the tensors remain, and the networks built from
them (1x).
"""

from __future__ import annotations

import ast
import hashlib
import io
import pickle
import struct
import sys
import warnings
from typing import Any, BinaryIO, Callable

import numpy as np
import torch

import dnnlib
from torch_utils import bounded_read, persistence

#----------------------------------------------------------------------------

# The longest embedded module source parsed: NVIDIA's training/networks.py has ~38k characters; a syntax tree takes
# up to ~450 bytes per character of source (a list of 1-character constants), so 128 Ki stay within the allowance.
MAX_SOURCE_CHARS = 1 << 17
MAX_STORAGE_OPCODES = 256  # Each of the five pickles of a storage's legacy torch.save: theirs have 3 to 30 opcodes.

# NVIDIA's networks read here -> ours. Ours take StyleGAN2-ADA's constructor kwargs and state dict keys.
NETWORKS = {
    'training.networks.Generator': 'training.networks.stylegan2.Generator',
    'training.networks.Discriminator': 'training.networks.stylegan2.Discriminator',
    'training.networks_stylegan2.Generator': 'training.networks.stylegan2.Generator',
    'training.networks_stylegan2.Discriminator': 'training.networks.stylegan2.Discriminator',
}
_SNAPSHOT_NETWORKS = ('G', 'D', 'G_ema')  # Entries of their snapshots that are networks.

# The persistent classes of NVIDIA's StyleGAN2 modules (training/networks.py of StyleGAN2-ADA, and
# training/networks_stylegan2.py of the StyleGAN3 repository, which has the same ones).
_STYLEGAN2_CLASSES = frozenset({
    'FullyConnectedLayer', 'MappingNetwork', 'Conv2dLayer', 'SynthesisLayer', 'ToRGBLayer', 'SynthesisBlock',
    'SynthesisNetwork', 'Generator', 'DiscriminatorBlock', 'MinibatchStdLayer', 'DiscriminatorEpilogue', 'Discriminator'})

# Where the StyleGAN3 repository's StyleGAN2 networks default otherwise than StyleGAN2-ADA's (kwargs of
# ours): SynthesisNetwork num_fp16_res 4 (0), SynthesisBlock conv_clamp 256 (None), MappingNetwork
# w_avg_beta 0.998 (0.995); Discriminator num_fp16_res 4 (0), conv_clamp 256 (None).
_STYLEGAN3_DEFAULTS = {
    'Generator': {'synthesis_kwargs': {'num_fp16_res': 4, 'conv_clamp': 256}, 'mapping_kwargs': {'w_avg_beta': 0.998}},
    'Discriminator': {'num_fp16_res': 4, 'conv_clamp': 256},
}
_GENERATOR_ARGS = ('z_dim', 'c_dim', 'w_dim', 'img_resolution', 'img_channels', 'mapping_kwargs')  # Not synthesis kwargs.

# Storages of a legacy torch.save, by the name of their type in module torch.
_STORAGE_DTYPES = {'FloatStorage': torch.float32, 'DoubleStorage': torch.float64, 'HalfStorage': torch.float16,
                   'BFloat16Storage': torch.bfloat16, 'LongStorage': torch.int64, 'IntStorage': torch.int32,
                   'ShortStorage': torch.int16, 'CharStorage': torch.int8, 'ByteStorage': torch.uint8,
                   'BoolStorage': torch.bool}
_LEGACY_MAGIC = 0x1950a86a20f9469cfc6c   # torch/serialization.py: MAGIC_NUMBER, PROTOCOL_VERSION.
_LEGACY_PROTOCOL = 1001
_INT64 = struct.Struct('<q')


class NvidiaPickleError(persistence.UnsafeSnapshotError):
    """The file is not a StyleGAN2 pickle of NVIDIA's code that can be read as data. One line, naming the file;
    nothing of the file has run."""


class _Refused(Exception):
    """Raised inside the unpickler and the readers; becomes NvidiaPickleError naming the file."""

#----------------------------------------------------------------------------
# What the unpickler builds in place of NVIDIA's objects.


class _Record:
    """An object the file asked for, as data. State set on it (pickle's BUILD) is refused."""
    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise _Refused(f'sets the state of a {type(self).__name__.strip("_").lower()}, which NVIDIA\'s pickles never do')


class _Persistent(_Record):
    """A persistent object of NVIDIA's torch_utils/persistence.py: its class name, module source and state."""
    __slots__ = ('class_name', 'module_src', 'state')

    def __init__(self, meta: Any) -> None:
        keys = {'type', 'version', 'module_src', 'class_name', 'state'}
        if not isinstance(meta, dict) or set(meta) != keys:
            raise _Refused(f'a persistent object\'s meta is not a dict of {", ".join(sorted(keys))}')
        if meta['type'] != 'class' or not isinstance(meta['version'], int):
            raise _Refused(f'a persistent object of type {str(meta["type"])[:40]}, version {str(meta["version"])[:20]}')
        if not isinstance(meta['class_name'], str) or not meta['class_name'].isidentifier():
            raise _Refused('a persistent object\'s class_name is not an identifier')
        if not isinstance(meta['module_src'], str) or len(meta['module_src']) > MAX_SOURCE_CHARS:
            raise _Refused(f'a persistent object\'s module_src is not a string of at most {MAX_SOURCE_CHARS:,} characters')
        if not isinstance(meta['state'], dict):
            raise _Refused(f'the state of a persistent {meta["class_name"]} is not a dict')
        self.class_name, self.module_src, self.state = meta['class_name'], meta['module_src'], meta['state']


class _Tensor(_Record):
    """A tensor read from the file (a view of a _Storage's elements)."""
    __slots__ = ('tensor',)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class _Storage(_Tensor):
    """A storage read from the file: its elements as a 1-D tensor."""
    __slots__ = ()


class _Dict(dict):
    """dnnlib.util.EasyDict and collections.OrderedDict of the file, as a dict."""

    def __setstate__(self, state: Any) -> None:
        raise _Refused('sets the state of a dict, which NVIDIA\'s pickles never do')


def _set(items: Any = ()) -> set:
    return set(items)


def _numpy_dtype(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    """numpy.dtype of a numeric type (its __setstate__, which pickle then calls, is NumPy's own)."""
    if not isinstance(spec, str) or spec.lstrip('<>=|')[:1] not in ('b', 'i', 'u', 'f', 'c') or len(spec) > 8:
        raise _Refused(f'asks for a NumPy dtype "{str(spec)[:20]}" that is not a numeric type')
    return np.dtype(spec)


def _numpy_scalar(dtype: Any, data: Any = None) -> np.generic:
    """A NumPy scalar from its dtype and raw bytes (their layers keep gains as numpy.float64)."""
    if not isinstance(dtype, np.dtype) or dtype.kind not in 'biufc' or not isinstance(data, bytes) or len(data) != dtype.itemsize:
        raise _Refused('holds a NumPy scalar that is not a number of its dtype')
    return np.frombuffer(data, dtype=dtype)[0]


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                    backward_hooks: Any = None, metadata: Any = None) -> _Tensor:
    """torch._utils._rebuild_tensor_v2: a view of `storage`, which must hold every element it shows."""
    if not isinstance(storage, _Storage):
        raise _Refused('rebuilds a tensor from something that is not a storage')
    if not (isinstance(offset, int) and isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride)
            and all(isinstance(n, int) and n >= 0 for n in (offset, *size, *stride))):
        raise _Refused('holds a tensor whose offset, size or stride are not non-negative integers')
    if backward_hooks or metadata:
        raise _Refused('holds a tensor with backward hooks or metadata')
    numel = storage.tensor.numel()
    if any(n == 0 for n in size):
        return _Tensor(storage.tensor.new_empty(size))
    if any(s == 0 and n > 1 for n, s in zip(size, stride)) or offset + sum((n - 1) * s for n, s in zip(size, stride)) >= numel:
        raise _Refused(f'holds a tensor of shape {list(size)} that reaches beyond its storage of {numel} elements '
                       f'or repeats its elements (stride 0)')
    return _Tensor(storage.tensor.as_strided(size, stride, offset))


def _rebuild_parameter(data: Any, requires_grad: Any = False, backward_hooks: Any = None, state: Any = None) -> _Tensor:
    """torch._utils._rebuild_parameter (and _with_state): the tensor; parameters are loaded into ours."""
    if not isinstance(data, _Tensor) or backward_hooks or state:
        raise _Refused('holds a parameter that is not a plain tensor')
    return data


def _load_storage(blob: Any) -> _Storage:
    """torch.storage._load_from_bytes: the storage of a legacy torch.save, read here (see the module docstring)."""
    if not isinstance(blob, bytes):
        raise _Refused('holds a storage that is not bytes')
    f = io.BytesIO(blob)
    header_ok = [lambda magic: magic == _LEGACY_MAGIC, lambda protocol: protocol == _LEGACY_PROTOCOL,
                 lambda sys_info: isinstance(sys_info, dict) and sys_info.get('little_endian') is True]
    for ok in header_ok:  # Each checked as it is read.
        if not ok(_StorageUnpickler.load_one(f)):
            raise _Refused('holds a storage that is not a little-endian legacy torch.save')
    storage = _StorageUnpickler.load_one(f)
    if not isinstance(storage, _StorageRef) or _StorageUnpickler.load_one(f) != [storage.key]:
        raise _Refused('holds a storage whose torch.save holds something else')
    count_bytes = f.read(_INT64.size)
    dtype, numel = storage.dtype, storage.numel
    num_bytes = numel * torch.empty((), dtype=dtype).element_size()
    if len(count_bytes) != _INT64.size or _INT64.unpack(count_bytes)[0] != numel or len(blob) - f.tell() != num_bytes:
        raise _Refused(f'holds a storage that declares {numel:,} elements of {dtype} but carries {len(blob) - f.tell():,} bytes')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # frombuffer warns that bytes are not writable: the elements are copied at once.
        elements = torch.frombuffer(blob, dtype=dtype, count=numel, offset=f.tell()).clone() if numel else torch.empty(0, dtype=dtype)
    return _Storage(elements)


class _StorageRef:
    """The persistent id of a legacy torch.save's storage, until its bytes are read."""

    def __init__(self, dtype: torch.dtype, key: str, numel: int) -> None:
        self.dtype, self.key, self.numel = dtype, key, numel


class _StorageUnpickler(pickle.Unpickler):
    """The pickles of a legacy torch.save of one storage: plain values, and the storage's persistent id."""

    def find_class(self, module: str, name: str) -> Any:
        if module == 'torch' and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        raise _Refused(f'names the global {module[:100]}.{name[:100]} in a storage, which is not read')

    def persistent_load(self, pid: Any) -> _StorageRef:
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == 'storage' and isinstance(pid[1], torch.dtype)
                and isinstance(pid[2], str) and isinstance(pid[4], int) and pid[4] >= 0 and (len(pid) == 5 or pid[5] is None)):
            raise _Refused('holds a storage whose persistent id is not that of a whole storage')
        return _StorageRef(pid[1], pid[2], pid[4])

    @classmethod
    def load_one(cls, f: io.BytesIO) -> Any:
        start = f.tell()
        try:
            bounded_read.check_pickle(f, 'a storage', max_opcodes=MAX_STORAGE_OPCODES)
        except bounded_read.RefusedFileError as e:
            raise _Refused(str(e)) from None
        f.seek(start)
        return cls(f).load()


_GLOBALS: dict[tuple[str, str], Callable] = {
    ('torch_utils.persistence', '_reconstruct_persistent_obj'): _Persistent,
    ('dnnlib.util', 'EasyDict'): _Dict,
    ('collections', 'OrderedDict'): _Dict,
    ('builtins', 'set'): _set,
    ('torch._utils', '_rebuild_tensor_v2'): _rebuild_tensor,
    ('torch._utils', '_rebuild_parameter'): _rebuild_parameter,
    ('torch._utils', '_rebuild_parameter_with_state'): _rebuild_parameter,
    ('torch.storage', '_load_from_bytes'): _load_storage,
    ('numpy', 'dtype'): _numpy_dtype,
    ('numpy.core.multiarray', 'scalar'): _numpy_scalar,   # Pickled with NumPy 1.
    ('numpy._core.multiarray', 'scalar'): _numpy_scalar,  # Pickled with NumPy 2.
}


class _Unpickler(pickle.Unpickler):
    """pickle.Unpickler whose globals are _GLOBALS and which has no persistent ids."""

    def find_class(self, module: str, name: str) -> Callable:
        if (module, name) not in _GLOBALS:
            raise _Refused(f'names the global {module[:100]}.{name[:100]}, which is not read')
        return _GLOBALS[(module, name)]

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused('holds a persistent id, which NVIDIA\'s pickles do not')

#----------------------------------------------------------------------------
# Which of NVIDIA's modules a persistent object's source is.


class _Module:
    """What a module source defines: its name among NVIDIA's (None: unrecognised) and its persistent classes."""

    def __init__(self, name: str | None, classes: frozenset[str]) -> None:
        self.name, self.classes = name, classes

    def qualname(self, class_name: str) -> str:
        return f'{self.name}.{class_name}' if self.name else f'{class_name} of an unrecognised module source'


_modules: dict[str, _Module] = {}  # sha256 of a source -> what it defines; its syntax tree is not kept.


def _is_persistent_class(node: ast.ClassDef) -> bool:
    return any(isinstance(d, ast.Attribute) and d.attr == 'persistent_class' or isinstance(d, ast.Name) and d.id == 'persistent_class'
               for d in node.decorator_list)


def _module_of(source: str) -> _Module:
    """Recognise one of NVIDIA's modules (module docstring table) by the persistent classes its source defines,
    parsed into a syntax tree that is never compiled or run."""
    key = hashlib.sha256(source.encode('utf-8', 'surrogatepass')).hexdigest()
    if key not in _modules:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            raise _Refused(f'holds a module source that does not parse as Python ({dnnlib.util.first_line(e, 100)})') from None
        defined = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef) and _is_persistent_class(node)}
        name = None
        if 'SynthesisInput' in defined:
            name = 'training.networks_stylegan3'
        elif _STYLEGAN2_CLASSES <= set(defined):
            init = next((node.args for node in defined['Generator'].body
                         if isinstance(node, ast.FunctionDef) and node.name == '__init__'), None)
            if init is not None and init.kwarg is not None and init.kwarg.arg == 'synthesis_kwargs':
                name = 'training.networks_stylegan2'
            elif init is not None and 'synthesis_kwargs' in [a.arg for a in init.args + init.kwonlyargs]:
                name = 'training.networks'
        elif 'AugmentPipe' in defined:
            name = 'training.augment'
        _modules[key] = _Module(name, frozenset(defined))
        del tree
    return _modules[key]

#----------------------------------------------------------------------------
# Networks: NVIDIA's records -> (kwargs, state dict) -> ours.


def _plain(value: Any, where: str, depth: int = 0) -> Any:
    """The file's containers as plain data (dicts, lists, tuples of scalars); anything else is refused."""
    if depth > dnnlib.util.MAX_PLAIN_DEPTH:
        raise _Refused(f'{where.split("[")[0][:100]}: nested deeper than {dnnlib.util.MAX_PLAIN_DEPTH} levels')
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise _Refused(f'{where}: a dict with keys that are not strings')
        return {k: _plain(v, f'{where}.{k}', depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_plain(v, f'{where}[{i}]', depth + 1) for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dnnlib.util.PLAIN_SCALARS):
        return value
    raise _Refused(f'{where}: holds a {type(value).__name__.strip("_").lower()} where plain data belongs')


def _state_dict(record: _Persistent, module: _Module, where: str) -> dict[str, torch.Tensor]:
    """The tensors that NVIDIA's module.state_dict() gives, from the records of the module and its layers."""
    state_dict: dict[str, torch.Tensor] = {}
    pending = [(record, '', 0)]  # Depth first, children in order: state_dict()'s order.
    while pending:
        layer, prefix, depth = pending.pop()
        name = f'{where}.{prefix.rstrip(".")}' if prefix else where
        if depth > dnnlib.util.MAX_PLAIN_DEPTH:
            raise _Refused(f'{name}: layers nested deeper than {dnnlib.util.MAX_PLAIN_DEPTH} levels')
        if not isinstance(layer, _Persistent):
            raise _Refused(f'{name} is a {type(layer).__name__.strip("_").lower()}, not a layer of {module.name}')
        if layer.module_src != record.module_src:
            raise _Refused(f'{name} is a {layer.class_name} of another module source, not a layer of {module.name}')
        if layer.class_name not in module.classes:
            raise _Refused(f'{name} is a {layer.class_name}, which {module.name} does not define')
        state = layer.state
        parameters, buffers, children = (state.get(key, {}) for key in ('_parameters', '_buffers', '_modules'))
        skipped = state.get('_non_persistent_buffers_set', set())
        if not all(isinstance(d, dict) for d in (parameters, buffers, children)) or not isinstance(skipped, set):
            raise _Refused(f'{name}: its _parameters, _buffers, _modules or _non_persistent_buffers_set are not what a module has')
        for key, value in [*parameters.items(), *((k, v) for k, v in buffers.items() if k not in skipped)]:
            if value is None:
                continue
            if not isinstance(key, str) or not isinstance(value, _Tensor) or isinstance(value, _Storage):
                raise _Refused(f'{name}: parameter or buffer {str(key)[:100]} is not a tensor')
            state_dict[prefix + key] = value.tensor
        if not all(isinstance(key, str) for key in children):
            raise _Refused(f'{name}: its _modules are not named by strings')
        pending += [(child, f'{prefix}{key}.', depth + 1) for key, child in reversed(children.items()) if child is not None]
    return state_dict


def _our_kwargs(module: _Module, class_name: str, kwargs: dict) -> dict:
    """Constructor kwargs of our class from those of NVIDIA's (module docstring)."""
    if module.name != 'training.networks_stylegan2':
        return kwargs
    if class_name == 'Generator':
        synthesis = {k: v for k, v in kwargs.items() if k not in _GENERATOR_ARGS}
        kwargs = {k: v for k, v in kwargs.items() if k in _GENERATOR_ARGS}
        kwargs.update(synthesis_kwargs=synthesis, mapping_kwargs=dict(kwargs.get('mapping_kwargs') or {}))
    for key, default in _STYLEGAN3_DEFAULTS[class_name].items():
        if isinstance(default, dict):
            kwargs[key] = {**default, **kwargs[key]}
        else:
            kwargs.setdefault(key, default)
    return kwargs


def _read_network(record: Any, where: str) -> tuple[str, dict, dict[str, torch.Tensor]]:
    """(NVIDIA's module.class name, its constructor kwargs, its state dict) of a G or D record."""
    if not isinstance(record, _Persistent):
        raise _Refused(f'{where} is a {type(record).__name__.strip("_").lower()}, not one of NVIDIA\'s networks')
    module = _module_of(record.module_src)
    name = module.qualname(record.class_name)
    if record.class_name not in module.classes or name not in NETWORKS:
        raise _Refused(f'{where} is a {name}, which is not read (only {", ".join(NETWORKS)})')
    args, kwargs = record.state.get('_init_args', ()), record.state.get('_init_kwargs')
    if args not in ((), []):
        raise _Refused(f'{where}: {name} was built with positional arguments, which are not read')
    if not isinstance(kwargs, dict):
        raise _Refused(f'{where}: {name} has no _init_kwargs dict')
    return name, _plain(kwargs, f'{where}.init_kwargs'), _state_dict(record, module, where)


def _network(record: Any, where: str) -> torch.nn.Module:
    """Our network from an NVIDIA G or D record (persistence.rebuild_network does every check)."""
    name, kwargs, state_dict = _read_network(record, where)
    kwargs = _our_kwargs(_module_of(record.module_src), record.class_name, kwargs)
    try:
        return persistence.rebuild_network(NETWORKS[name], kwargs, state_dict, f'{where} ({name})')
    except persistence.UnsafeSnapshotError as e:
        raise _Refused(str(e)) from None

#----------------------------------------------------------------------------
# The file.


def is_pickle(f: BinaryIO) -> bool:
    """Whether the file (read from its start) begins as a pickle of protocol 2 or later does, as NVIDIA's do."""
    f.seek(0)
    head = f.read(2)
    f.seek(0)
    return len(head) == 2 and head[0] == pickle.PROTO[0] and 2 <= head[1] <= pickle.HIGHEST_PROTOCOL


def _unpickle(data: bytes) -> Any:
    try:
        bounded_read.check_pickle(data, 'the file')
    except bounded_read.RefusedFileError as e:
        raise _Refused(str(e).removeprefix('the file: ')) from None
    try:
        return _Unpickler(io.BytesIO(data)).load()
    except _Refused:
        raise
    except Exception as e:  # noqa: BLE001 - arbitrary bytes can fail the unpickler in any way; only our stand-ins ran.
        raise _Refused(f'is not a pickle that can be read as data ({type(e).__name__}: {dnnlib.util.first_line(e, 200)})') from None


def _dropped(note: str) -> None:
    print(note, file=sys.stderr, flush=True)


def load_network_pickle(f: BinaryIO, path_or_url: str, dropped: Callable[[str], None] = _dropped) -> dnnlib.EasyDict:
    """Our networks from a StyleGAN2 pickle of NVIDIA's code (the file `f`, named `path_or_url` in messages), read
    as data (module docstring): an EasyDict with G, D and G_ema (those the file holds, on the CPU, in eval mode,
    requires_grad off) and training_set_kwargs (or None). What is not kept is named in one line each through
    `dropped`. Raises NvidiaPickleError (one line) or OSError."""
    f.seek(0)
    data = f.read()
    try:
        snapshot = _unpickle(data)
        del data
        if not isinstance(snapshot, dict) or not any(key in snapshot for key in _SNAPSHOT_NETWORKS):
            raise _Refused(f'is not a StyleGAN2 snapshot of NVIDIA\'s code (a dict with {", ".join(_SNAPSHOT_NETWORKS)})')
        result = dnnlib.EasyDict(training_set_kwargs=None)
        for key, value in snapshot.items():
            if key in _SNAPSHOT_NETWORKS:
                if value is not None:
                    result[key] = _network(value, key)
            elif key == 'training_set_kwargs' and value is not None:
                result[key] = _training_set_kwargs(value, dropped, path_or_url)
            elif value is not None:
                what = _module_of(value.module_src).qualname(value.class_name) if isinstance(value, _Persistent) else \
                    type(value).__name__.strip('_').lower()
                dropped(f'{path_or_url}: dropped {str(key)[:100]} ({what}): this project does not use it')
    except _Refused as e:
        raise NvidiaPickleError(f'{path_or_url}: refused to load: {e}; nothing in it was run') from None
    return result


def _training_set_kwargs(value: Any, dropped: Callable[[str], None], path: str) -> dnnlib.EasyDict | None:
    """NVIDIA's ImageFolderDataset kwargs name ours (dnnlib.util.RENAMED_CLASSES) and take the same arguments."""
    kwargs = _plain(value, 'training_set_kwargs')
    try:
        return dnnlib.util.check_class_kwargs(kwargs, 'training_set_kwargs')
    except dnnlib.util.ConfigError as e:
        dropped(f'{path}: dropped training_set_kwargs: {dnnlib.util.first_line(e, 200)}')
        return None
