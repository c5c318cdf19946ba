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
refused: `NvidiaPickleError`, one line, nothing of the file run. So is a file whose reading would go
beyond the bound below, before it does.

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

Memory (torch_utils/bounded_read.py's bound, MEMORY_FACTOR x file size + MEMORY_ALLOWANCE) and time: the file
is read whole (1x); its opcodes are checked before it is unpickled (_check_opcodes: at most
MAX_PICKLE_OPCODES, each making one small object; no string beyond MAX_STRING_BYTES, no memo index
skipping ahead; and the tuples hashed as dict keys or set items, counted as the tuples hashing visits, a
memoized tuple each time, at most MAX_HASH_VISITS), without decoding them. The unpickler's stand-ins are
functions (or _Dict, which takes no arguments), so NEWOBJ, OBJ and INST reach them only through their
checks. The storages' bytes live in the unpickler (1x) while each is copied into its tensor, and only after
its declared element count was found within those bytes (the five small pickles before them checked as
the file is, at most MAX_STORAGE_OPCODES opcodes each); the storages made may hold at most the file's
size in all (1x), so a blob the memo hands to many calls counts each time. A tensor must lie within its
storage without broadcast strides. At most MAX_SOURCES distinct sources are parsed, one at a time, their
syntax trees dropped at once (at most ~60 MiB for MAX_SOURCE_CHARS). What the records expand to is
counted before it is made: plain data (kwargs, training_set_kwargs) as the tree it copies to, at most
MAX_PLAIN_ITEMS values; the networks' layers and tensors as often as the layers reach them (a layer
shared by two others counts twice), each with what its object takes (LAYER_COST, TENSOR_COST) and each
tensor with its bytes, at most 2 x the file's size + NETWORK_ALLOWANCE in all (their tensors copied
into the networks built). Kwargs must have the types of NVIDIA's (_KWARG_RULES), and the latent, style
and label dimensions at most the elements of the network's tensors (a 10^9-dimensional label over an
empty embedding would take 4 GB an image to run). persistence.rebuild_network then builds on the meta
device within 2 x the tensors' bytes and number. A real network, of any resolution, has its tensors in the
file and is within each bound.

Text of the file is printed as data: escaped (newlines, terminal escape codes), cut, on one line.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import pickle
import pickletools
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
MAX_STRING_BYTES = 4 * MAX_SOURCE_CHARS  # The longest string of the file (UTF-8: up to 4 bytes a character).
MAX_SOURCES = 4            # Distinct module sources in one file: NVIDIA's hold 2 (networks, augment); each is parsed.
MAX_STORAGE_OPCODES = 256  # Each of the five pickles of a storage's legacy torch.save: theirs have 3 to 30 opcodes.
MAX_PLAIN_ITEMS = 10_000   # Values of a file's plain data (kwargs, training_set_kwargs), shared ones counted each time.
# Hashing a tuple visits every tuple inside it, every time (Python caches no tuple's hash): the tuples of a file
# hashed as dict keys and set items may take at most this many visits in all (theirs: one per key).
MAX_HASH_VISITS = 1 << 22
# What the networks built from a file may take: their tensors as copied into them, and per layer and per tensor what
# a torch.nn.Module (~2.4 KiB with its dicts) and a tensor object take, each layer and tensor counted as often as the
# file's layers reach it; at most 2 x the file's size + NETWORK_ALLOWANCE (see Memory in the module docstring).
NETWORK_ALLOWANCE = 64 << 20
LAYER_COST = 4 << 10
TENSOR_COST = 1 << 10
MAX_MESSAGE_CHARS = 600    # A refusal or a note, cut to this.

# NVIDIA's networks read here -> ours. Ours take StyleGAN2-ADA's constructor kwargs and state dict keys.
NETWORKS = {
    'training.networks.Generator': 'training.networks.stylegan2.Generator',
    'training.networks.Discriminator': 'training.networks.stylegan2.Discriminator',
    'training.networks_stylegan2.Generator': 'training.networks.stylegan2.Generator',
    'training.networks_stylegan2.Discriminator': 'training.networks.stylegan2.Discriminator',
}
_SNAPSHOT_NETWORKS = {'G': 'Generator', 'D': 'Discriminator', 'G_ema': 'Generator'}  # Entries that are networks.

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


def _count(value: Any, none: bool = False, limit: int = 1 << 31) -> bool:
    return value is None and none or isinstance(value, int) and not isinstance(value, bool) and 0 <= value < limit


def _number(value: Any, none: bool = False) -> bool:
    return value is None and none or isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e30


# The kwargs of NVIDIA's StyleGAN2 networks, at any level of their nesting (StyleGAN2-ADA's and the StyleGAN3
# repository's share the names): what each value must be, checked before anything is built or run. Names not
# listed are left to the constructors (persistence.rebuild_network refuses those they do not take).
_ACTIVATIONS = ('linear', 'relu', 'lrelu', 'tanh', 'sigmoid', 'elu', 'selu', 'softplus', 'swish')
_KWARG_RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    **{name: ('an integer in [0, 2^31)', _count) for name in (
        'z_dim', 'c_dim', 'w_dim', 'img_resolution', 'img_channels', 'channel_base', 'channel_max', 'num_fp16_res',
        'num_layers', 'mbstd_num_channels', 'freeze_layers')},
    **{name: ('an integer in [0, 2^31) or None', functools.partial(_count, none=True)) for name in (
        'embed_features', 'layer_features', 'cmap_dim', 'mbstd_group_size')},
    'conv_clamp': ('a number or None', functools.partial(_number, none=True)),
    'lr_multiplier': ('a number', _number),
    'w_avg_beta': ('a number or None', functools.partial(_number, none=True)),
    'architecture': ('one of orig, skip, resnet', lambda v: v in ('orig', 'skip', 'resnet')),
    'activation': (f'one of {", ".join(_ACTIVATIONS)}', lambda v: isinstance(v, str) and v in _ACTIVATIONS),
    'use_noise': ('true or false', lambda v: isinstance(v, bool)),
    'fp16_channels_last': ('true or false', lambda v: isinstance(v, bool)),
    'fused_modconv_default': ('true, false, None or inference_only', lambda v: v in (True, False, None, 'inference_only')),
    'resample_filter': ('a list of at most 16 numbers', lambda v: isinstance(v, (list, tuple)) and 0 < len(v) <= 16
                        and all(_number(x) for x in v)),
    **{name: ('a dict', lambda v: isinstance(v, dict)) for name in (
        'mapping_kwargs', 'synthesis_kwargs', 'block_kwargs', 'epilogue_kwargs')},
}
# The label and latent dimensions size what running a network allocates (a label of c_dim values per image): each
# must be at most the elements the network's tensors hold (a real one's embedding and first layer hold many more).
_INPUT_DIMS = {'z_dim': 'latent dimension', 'c_dim': 'label dimension', 'w_dim': 'style dimension'}

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
# Text of the file, as data.


def _text(value: Any, limit: int = 100, quoted: bool = False) -> str:
    """What the file holds, for a message: a string escaped (no control character, no newline) and cut to `limit`
    characters (`quoted`: in quotes), a small number as written, anything else by its type (never by str(), which
    would expand it)."""
    if isinstance(value, str):
        text = repr(value[:limit])[1:-1] + ('...' if len(value) > limit else '')
        return f"'{text}'" if quoted else text
    if isinstance(value, (bool, float, type(None))) or isinstance(value, int) and abs(value) < 10 ** 18:
        return repr(value)[:limit]
    if isinstance(value, int):
        return f'a {value.bit_length()}-bit integer'
    return f'a {type(value).__name__.strip("_").lower()}'


def _one_line(message: str) -> str:
    """A message as one line of printable text: control characters (newlines, escape codes) escaped, cut."""
    if not message.isprintable():
        message = ''.join(c if c.isprintable() else repr(c)[1:-1] for c in message[:4 * MAX_MESSAGE_CHARS])
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS - 3] + '...'

#----------------------------------------------------------------------------
# The pickle's opcodes, checked before anything is unpickled.

_STRING_OPCODES = {'STRING', 'BINSTRING', 'SHORT_BINSTRING', 'UNICODE', 'SHORT_BINUNICODE', 'BINUNICODE', 'BINUNICODE8'}
_LENGTH_PREFIX = {pickletools.TAKEN_FROM_ARGUMENT1: ('<B', 1), pickletools.TAKEN_FROM_ARGUMENT4: ('<i', 4),
                  pickletools.TAKEN_FROM_ARGUMENT4U: ('<I', 4), pickletools.TAKEN_FROM_ARGUMENT8U: ('<Q', 8)}
_MEMO_INDEX = {'uint1': '<B', 'uint4': '<I'}
_MAX_NODES = 1 << 40  # Tuple node counts saturate here.


def _check_opcodes(data: bytes, start: int, what: str, max_opcodes: int, interrupt: Callable[[], None]) -> int:
    """Refuse (_Refused) a pickle (in `data` from `start` to its STOP, which is returned) that Python's unpickler could
    not load within the bound, before it is loaded, reading its opcodes without decoding their arguments: more than
    `max_opcodes`; a string longer than MAX_STRING_BYTES; memo indices that skip ahead (the C unpickler grows its memo
    to twice the largest index); or tuples hashed as dict keys and set items whose hashing would visit more than
    MAX_HASH_VISITS tuples (a tuple of n tuples that are one memoized tuple of n ... visits n^depth). It follows the
    unpickler's stack (its marks apart): each item is the number of tuple nodes hashing it visits (1: not a tuple)."""
    stack: list[int] = []
    marks: list[int] = []  # Where each mark is in the stack: the unpickler keeps them apart, as here.
    memo: dict[int, int] = {}
    hash_visits, pos = 0, start

    def refuse(why: str) -> _Refused:
        return _Refused(f'{what}: {why}' if what else why)

    def pop_to_mark() -> list[int]:
        if not marks:
            raise refuse('is not a pickle (an opcode takes a mark that is not there)')
        at = marks.pop()
        items = stack[at:]
        del stack[at:]
        return items

    def pop(count: int) -> list[int]:
        if len(stack) - count < (marks[-1] if marks else 0):
            raise refuse('is not a pickle (its stack runs out)')
        items = stack[len(stack) - count:]
        del stack[len(stack) - count:]
        return items

    for count in range(max_opcodes + 1):
        if count % 65536 == 65535:
            interrupt()
        if count == max_opcodes:
            raise refuse(f'a pickle of more than {max_opcodes:,} opcodes')
        op = pickletools.code2op.get(chr(data[pos])) if pos < len(data) else None
        if op is None:
            raise refuse('is not a pickle (no STOP)' if pos >= len(data) else f'is not a pickle (opcode {data[pos]:#04x} at byte {pos})')
        pos, name, arg, index = pos + 1, op.name, op.arg, None
        if arg is None:
            pass
        elif arg.n == pickletools.UP_TO_NEWLINE:  # One line, two for a module and a name.
            for _ in range(2 if arg.name == 'stringnl_noescape_pair' else 1):
                end = data.find(b'\n', pos, pos + MAX_STRING_BYTES + 1)
                if end < 0:
                    raise refuse(f'a line of the pickle is longer than {MAX_STRING_BYTES:,} bytes or has no end')
                if name in ('GET', 'PUT'):
                    index = int(data[pos:end]) if data[pos:end].isdigit() else -1
                pos = end + 1
        elif arg.n in _LENGTH_PREFIX:
            prefix, width = _LENGTH_PREFIX[arg.n]
            if pos + width > len(data):
                raise refuse('is not a pickle (it ends inside an opcode)')
            (length,) = struct.unpack_from(prefix, data, pos)
            if name in _STRING_OPCODES and length > MAX_STRING_BYTES:
                raise refuse(f'holds a string of {length:,} bytes (at most {MAX_STRING_BYTES:,} are read)')
            if length < 0 or pos + width + length > len(data):
                raise refuse(f'is not a pickle ({name} at byte {pos - 1} claims {length:,} bytes beyond its end)')
            pos += width + length
        else:
            if pos + arg.n > len(data):
                raise refuse('is not a pickle (it ends inside an opcode)')
            if arg.name in _MEMO_INDEX and name.endswith(('GET', 'PUT')):
                (index,) = struct.unpack_from(_MEMO_INDEX[arg.name], data, pos)
            pos += arg.n
        # The stack and the memo, as the unpickler keeps them.
        if name == 'STOP':
            pop(1)
            return pos
        if name == 'MARK':
            marks.append(len(stack))
        elif name.endswith('PUT') or name == 'MEMOIZE':
            index = len(memo) if name == 'MEMOIZE' else index
            if index is None or not 0 <= index <= len(memo):
                raise refuse(f'the pickle stores memo entry {index} after {len(memo)}')
            if len(stack) <= (marks[-1] if marks else 0):
                raise refuse('is not a pickle (it memoizes what is not there)')
            memo[index] = stack[-1]
        elif name.endswith('GET'):
            if index not in memo:
                raise refuse(f'is not a pickle (it fetches memo entry {index}, which is not there)')
            stack.append(memo[index])
        elif name == 'DUP':
            stack += pop(1) * 2
        elif name == 'POP' and marks and marks[-1] == len(stack):  # The unpickler's POP takes a mark on top.
            marks.pop()
        elif pickletools.markobject in op.stack_before:
            items = pop_to_mark()
            below = pop(op.stack_before.index(pickletools.markobject))
            if name == 'SETITEMS':
                hash_visits += sum(items[0::2])
            elif name in ('ADDITEMS', 'FROZENSET'):
                hash_visits += sum(items)
            stack += below[:len(op.stack_after)] if below else [min(1 + sum(items), _MAX_NODES) if name == 'TUPLE' else 1
                                                                for _ in op.stack_after]
        elif name in ('TUPLE1', 'TUPLE2', 'TUPLE3'):
            stack.append(min(1 + sum(pop(int(name[-1]))), _MAX_NODES))
        elif name == 'SETITEM':
            hash_visits += pop(2)[0]
        elif name in ('APPEND', 'BUILD'):
            pop(1)
        else:
            pop(len(op.stack_before))
            stack += [1] * len(op.stack_after)
        if hash_visits > MAX_HASH_VISITS:
            raise refuse(f'hashing its dict keys and set items would visit more than {MAX_HASH_VISITS:,} '
                         f'tuples (tuples nested in memoized tuples)')
    raise AssertionError('unreachable')

#----------------------------------------------------------------------------
# What the unpickler builds in place of NVIDIA's objects.


class _Load:
    """One file being read: its size, and what has been read of it against the bounds (module docstring)."""

    def __init__(self, file_size: int, interrupt: Callable[[], None]) -> None:
        self.file_size, self._interrupt = file_size, interrupt
        self.interrupted: BaseException | None = None  # What interrupt() raised (passed through the unpickler).
        self.storage_bytes = 0           # Elements of the storages read so far: at most the file's size.
        self.sources: dict[int, str] = {}  # id -> module source of the records (the strings kept alive here).
        self.distinct_sources: set[str] = set()  # Their sha256.
        self.network_bytes = 0           # What the networks built from the file take (NETWORK_ALLOWANCE).
        self.plain_items = 0             # Values of plain data read (MAX_PLAIN_ITEMS).

    def interrupt(self) -> None:
        try:
            self._interrupt()
        except BaseException as e:
            self.interrupted = e
            raise

    def max_network_bytes(self) -> int:
        return 2 * self.file_size + NETWORK_ALLOWANCE

    def add_network_bytes(self, num_bytes: int, where: str) -> None:
        self.network_bytes += num_bytes
        if self.network_bytes > self.max_network_bytes():
            raise _Refused(f'{where}: its networks would take more than {self.max_network_bytes():,} bytes (2 x the file\'s '
                           f'size + {NETWORK_ALLOWANCE >> 20} MiB), counting each layer and tensor as often as the file\'s '
                           f'layers reach it')


class _Record:
    """An object the file asked for, as data. State set on it (pickle's BUILD) is refused."""
    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise _Refused(f'sets the state of a {type(self).__name__.strip("_").lower()}, which NVIDIA\'s pickles never do')


class _Persistent(_Record):
    """A persistent object of NVIDIA's torch_utils/persistence.py: its class name, module source and state."""
    __slots__ = ('class_name', 'module_src', 'state')

    def __init__(self, class_name: str, module_src: str, state: dict) -> None:
        self.class_name, self.module_src, self.state = class_name, module_src, state


def _persistent(load: _Load, *args: Any) -> _Persistent:
    """NVIDIA's persistence._reconstruct_persistent_obj(meta), as a record of the meta dict."""
    keys = {'type', 'version', 'module_src', 'class_name', 'state'}
    if len(args) != 1:
        raise _Refused(f'calls NVIDIA\'s persistent-object constructor with {len(args)} arguments instead of its meta dict')
    meta = args[0]
    if not isinstance(meta, dict) or not all(isinstance(key, str) for key in meta) or set(meta) != keys:
        raise _Refused(f'a persistent object\'s meta is not a dict of {", ".join(sorted(keys))}')
    if meta['type'] != 'class' or not _count(meta['version']):
        raise _Refused(f'a persistent object of type {_text(meta["type"], 40)}, version {_text(meta["version"], 20)}')
    if not isinstance(meta['class_name'], str) or not meta['class_name'].isidentifier() or len(meta['class_name']) > 100:
        raise _Refused(f'a persistent object\'s class_name {_text(meta["class_name"])} is not an identifier')
    source = meta['module_src']
    if not isinstance(source, str) or len(source) > MAX_SOURCE_CHARS:
        raise _Refused(f'a persistent object\'s module_src is not a string of at most {MAX_SOURCE_CHARS:,} characters')
    if not isinstance(meta['state'], dict) or not all(isinstance(key, str) for key in meta['state']):
        raise _Refused(f'the state of a persistent {meta["class_name"]} is not a dict of named attributes')
    if id(source) not in load.sources:  # Each string hashed once: records share their source through the memo.
        load.sources[id(source)] = source
        load.distinct_sources.add(hashlib.sha256(source.encode('utf-8', 'surrogatepass')).hexdigest())
        if len(load.distinct_sources) > MAX_SOURCES:
            raise _Refused(f'its persistent objects have more than {MAX_SOURCES} distinct module sources (NVIDIA\'s '
                           f'have 2), each of which would be parsed')
    return _Persistent(meta['class_name'], source, meta['state'])


class _Tensor(_Record):
    """A tensor read from the file (a view of a _Storage's elements)."""
    __slots__ = ('tensor',)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class _Storage(_Tensor):
    """A storage read from the file: its elements as a 1-D tensor."""
    __slots__ = ()


class _Dict(dict):
    """dnnlib.util.EasyDict (pickled as NEWOBJ, then its items) and collections.OrderedDict (a call without arguments,
    then its items) of the file, as a dict. It takes no arguments: its keys are hashed as the pickle sets them, which
    _check_opcodes has bounded."""

    def __init__(self) -> None:
        super().__init__()

    def __setstate__(self, state: Any) -> None:
        raise _Refused('sets the state of a dict, which NVIDIA\'s pickles never do')


def _set(items: Any = ()) -> set:
    if not isinstance(items, (list, tuple)) or not all(isinstance(item, str) for item in items):
        raise _Refused('makes a set of something other than names')
    return set(items)


def _numpy_dtype(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    """numpy.dtype of a numeric type (its __setstate__, which pickle then calls, is NumPy's own)."""
    if not isinstance(spec, str) or len(spec) > 8 or spec.lstrip('<>=|')[:1] not in ('b', 'i', 'u', 'f', 'c'):
        raise _Refused(f'asks for a NumPy dtype "{_text(spec, 20)}" that is not a numeric type')
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
    if not (isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride) <= 8 and
            all(_count(n, limit=1 << 62) for n in (offset, *size, *stride))):
        raise _Refused('holds a tensor whose offset, size or stride are not at most 8 integers in [0, 2^62)')
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
    if not isinstance(data, _Tensor) or isinstance(data, _Storage) or backward_hooks or state:
        raise _Refused('holds a parameter that is not a plain tensor')
    return data


def _load_storage(load: _Load, blob: Any) -> _Storage:
    """torch.storage._load_from_bytes: the storage of a legacy torch.save, read here (see the module docstring). The
    storages of a file may hold at most as many bytes as the file: a blob read again (through the memo) counts again."""
    if not isinstance(blob, bytes):
        raise _Refused('holds a storage that is not bytes')
    load.interrupt()
    f = io.BytesIO(blob)
    header_ok = [lambda magic: magic == _LEGACY_MAGIC, lambda protocol: protocol == _LEGACY_PROTOCOL,
                 lambda sys_info: isinstance(sys_info, dict) and sys_info.get('little_endian') is True]
    for ok in header_ok:  # Each checked as it is read.
        if not ok(_StorageUnpickler.load_one(blob, f, load.interrupt)):
            raise _Refused('holds a storage that is not a little-endian legacy torch.save')
    storage = _StorageUnpickler.load_one(blob, f, load.interrupt)
    if not isinstance(storage, _StorageRef) or _StorageUnpickler.load_one(blob, f, load.interrupt) != [storage.key]:
        raise _Refused('holds a storage whose torch.save holds something else')
    count_bytes = f.read(_INT64.size)
    dtype, numel = storage.dtype, storage.numel
    num_bytes = numel * torch.empty((), dtype=dtype).element_size()
    if len(count_bytes) != _INT64.size or _INT64.unpack(count_bytes)[0] != numel or len(blob) - f.tell() != num_bytes:
        raise _Refused(f'holds a storage that declares {numel:,} elements of {dtype} but carries {len(blob) - f.tell():,} bytes')
    load.storage_bytes += num_bytes
    if load.storage_bytes > load.file_size:
        raise _Refused(f'its storages would hold more than the {load.file_size:,} bytes of the file (a storage read '
                       f'more than once)')
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
        raise _Refused(f'names the global {_text(module)}.{_text(name)} in a storage, which is not read')

    def persistent_load(self, pid: Any) -> _StorageRef:
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == 'storage' and isinstance(pid[1], torch.dtype)
                and isinstance(pid[2], str) and _count(pid[4], limit=1 << 62) and (len(pid) == 5 or pid[5] is None)):
            raise _Refused('holds a storage whose persistent id is not that of a whole storage')
        return _StorageRef(pid[1], pid[2], pid[4])

    @classmethod
    def load_one(cls, blob: bytes, f: io.BytesIO, interrupt: Callable[[], None]) -> Any:
        """The next pickle of `f`, a file of `blob`, once its opcodes are checked."""
        _check_opcodes(blob, f.tell(), 'a storage', MAX_STORAGE_OPCODES, interrupt)
        try:
            return cls(f).load()
        except _Refused:
            raise
        except Exception as e:  # noqa: BLE001 - arbitrary bytes can fail the unpickler in any way; only plain values ran.
            raise _Refused(f'holds a storage that is not a legacy torch.save ({type(e).__name__}: '
                           f'{dnnlib.util.first_line(e, 100)})') from None


class _Unpickler(pickle.Unpickler):
    """pickle.Unpickler whose globals are the stand-ins below (functions, and _Dict: NEWOBJ, OBJ and INST make
    nothing else without the checks of its stand-in) and which has no persistent ids."""

    def __init__(self, file: BinaryIO, load: _Load) -> None:
        super().__init__(file)
        self.globals = {
            ('torch_utils.persistence', '_reconstruct_persistent_obj'): functools.partial(_persistent, load),
            ('dnnlib.util', 'EasyDict'): _Dict,
            ('collections', 'OrderedDict'): _Dict,
            ('builtins', 'set'): _set,
            ('torch._utils', '_rebuild_tensor_v2'): _rebuild_tensor,
            ('torch._utils', '_rebuild_parameter'): _rebuild_parameter,
            ('torch._utils', '_rebuild_parameter_with_state'): _rebuild_parameter,
            ('torch.storage', '_load_from_bytes'): functools.partial(_load_storage, load),
            ('numpy', 'dtype'): _numpy_dtype,
            ('numpy.core.multiarray', 'scalar'): _numpy_scalar,   # Pickled with NumPy 1.
            ('numpy._core.multiarray', 'scalar'): _numpy_scalar,  # Pickled with NumPy 2.
        }

    def find_class(self, module: str, name: str) -> Callable:
        if (module, name) not in self.globals:
            raise _Refused(f'names the global {_text(module)}.{_text(name)}, which is not read')
        return self.globals[(module, name)]

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
            raise _Refused(f'holds a module source that does not parse as Python ({_text(dnnlib.util.first_line(e))})') from None
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


def _plain(value: Any, where: str, load: _Load) -> Any:
    """The file's containers as plain data (dicts named by identifiers, lists, tuples of scalars), copied as the tree
    they expand to: at most MAX_PLAIN_ITEMS values in all (a dict shared by two others counts twice), nested at most
    MAX_PLAIN_DEPTH deep; anything else is refused."""
    def copy(value: Any, path: str, depth: int) -> Any:
        load.plain_items += 1
        if load.plain_items > MAX_PLAIN_ITEMS:
            raise _Refused(f'{where}: plain data of more than {MAX_PLAIN_ITEMS:,} values (counting shared ones each time)')
        if load.plain_items % 4096 == 0:
            load.interrupt()
        if depth > dnnlib.util.MAX_PLAIN_DEPTH:
            raise _Refused(f'{where}: nested deeper than {dnnlib.util.MAX_PLAIN_DEPTH} levels')
        if isinstance(value, dict):
            for k in value:
                if not isinstance(k, str) or not k.isidentifier() or len(k) > 100:
                    raise _Refused(f'{path}: a dict with a key {_text(k)}, which is not a name')
            return {k: copy(v, f'{path}.{k}', depth + 1) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [copy(v, f'{path}[{i}]', depth + 1) for i, v in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, dnnlib.util.PLAIN_SCALARS) and not (isinstance(value, int) and abs(value) >= 1 << 63):
            return value
        raise _Refused(f'{path}: holds {_text(value)} where plain data belongs')
    return copy(value, where, 0)


def _check_kwargs(kwargs: dict, where: str) -> None:
    """NVIDIA's kwargs (_KWARG_RULES), at every level of their nesting, before anything is built from them."""
    for key, value in kwargs.items():
        if key in _KWARG_RULES and not _KWARG_RULES[key][1](value):
            raise _Refused(f'{where}.{key} is {_text(value, 40, quoted=True)}, not {_KWARG_RULES[key][0]}')
        if isinstance(value, dict):
            _check_kwargs(value, f'{where}.{key}')


def _state_dict(record: _Persistent, module: _Module, where: str, load: _Load) -> dict[str, torch.Tensor]:
    """The tensors that NVIDIA's module.state_dict() gives, from the records of the module and its layers; each layer
    and tensor counted (_Load.add_network_bytes) as often as the layers reach it, before the next is visited."""
    state_dict: dict[str, torch.Tensor] = {}
    pending = [(record, '', 0)]  # Depth first, children in order: state_dict()'s order.
    while pending:
        layer, prefix, depth = pending.pop()
        name = f'{where}.{prefix.rstrip(".")}' if prefix else where
        load.add_network_bytes(LAYER_COST, where)
        if len(state_dict) % 256 == 0:
            load.interrupt()
        if depth > dnnlib.util.MAX_PLAIN_DEPTH:
            raise _Refused(f'{name}: layers nested deeper than {dnnlib.util.MAX_PLAIN_DEPTH} levels')
        if not isinstance(layer, _Persistent):
            raise _Refused(f'{name} is {_text(layer)}, not a layer of {module.name}')
        if layer.module_src is not record.module_src and layer.module_src != record.module_src:
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
            if not isinstance(key, str) or not key.isidentifier() or not isinstance(value, _Tensor) or isinstance(value, _Storage):
                raise _Refused(f'{name}: parameter or buffer {_text(key)} is not a tensor named by an identifier')
            load.add_network_bytes(TENSOR_COST + value.tensor.numel() * value.tensor.element_size(), where)
            state_dict[prefix + key] = value.tensor
        if not all(isinstance(key, str) and key.isidentifier() for key in children):
            raise _Refused(f'{name}: its _modules are not named by identifiers')
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


def _read_network(record: Any, where: str, kind: str, load: _Load) -> tuple[str, dict, dict[str, torch.Tensor]]:
    """(NVIDIA's module.class name, its constructor kwargs, its state dict) of a G or D record (`kind`: Generator or
    Discriminator)."""
    if not isinstance(record, _Persistent):
        raise _Refused(f'{where} is {_text(record)}, not one of NVIDIA\'s networks')
    module = _module_of(record.module_src)
    name = module.qualname(record.class_name)
    if record.class_name not in module.classes or name not in NETWORKS:
        raise _Refused(f'{where} is a {name}, which is not read (only {", ".join(NETWORKS)})')
    if record.class_name != kind:
        raise _Refused(f'{where} is a {name}, where a {kind} belongs')
    args, kwargs = record.state.get('_init_args', ()), record.state.get('_init_kwargs')
    if not isinstance(args, (tuple, list)) or len(args) != 0:
        raise _Refused(f'{where}: {name} was built with positional arguments, which are not read')
    if not isinstance(kwargs, dict):
        raise _Refused(f'{where}: {name} has no _init_kwargs dict')
    kwargs = _plain(kwargs, f'{where}.init_kwargs', load)
    _check_kwargs(kwargs, f'{where}.init_kwargs')
    return name, kwargs, _state_dict(record, module, where, load)


def _network(record: Any, where: str, kind: str, load: _Load) -> torch.nn.Module:
    """Our network from an NVIDIA G or D record (persistence.rebuild_network does every check of the build), once its
    input dimensions are found within what its tensors hold (_INPUT_DIMS)."""
    name, kwargs, state_dict = _read_network(record, where, kind, load)
    kwargs = _our_kwargs(_module_of(record.module_src), record.class_name, kwargs)
    elements = sum(tensor.numel() for tensor in state_dict.values())
    for key, what in _INPUT_DIMS.items():
        if isinstance(kwargs.get(key), int) and kwargs[key] > elements:
            raise _Refused(f'{where}: {name} asks for a {what} ({key}) of {kwargs[key]:,}, more than the {elements:,} '
                           f'elements its tensors hold')
    try:
        # Our StyleGAN2 networks register exactly the tensors they save (and a few filters).
        return persistence.rebuild_network(NETWORKS[name], kwargs, state_dict, f'{where} ({name})',
                                           max_tensors=2 * len(state_dict) + 64)
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


def _unpickle(data: bytes, load: _Load) -> Any:
    _check_opcodes(data, 0, '', bounded_read.MAX_PICKLE_OPCODES, load.interrupt)
    try:
        return _Unpickler(io.BytesIO(data), load).load()
    except _Refused:
        raise
    except Exception as e:  # noqa: BLE001 - arbitrary bytes can fail the unpickler in any way; only our stand-ins ran.
        if load.interrupted is not None:
            raise load.interrupted from None
        raise _Refused(f'is not a pickle that can be read as data ({type(e).__name__}: {_text(dnnlib.util.first_line(e), 200)})') from None


def _dropped(note: str) -> None:
    print(note, file=sys.stderr, flush=True)


def _no_interrupt() -> None:
    pass


def load_network_pickle(f: BinaryIO, path_or_url: str, dropped: Callable[[str], None] = _dropped,
                        interrupt: Callable[[], None] = _no_interrupt) -> dnnlib.EasyDict:
    """Our networks from a StyleGAN2 pickle of NVIDIA's code (the file `f`, named `path_or_url` in messages), read
    as data (module docstring): an EasyDict with G, D and G_ema (those the file holds, on the CPU, in eval mode,
    requires_grad off) and training_set_kwargs (or None). What is not kept is named in one line each through
    `dropped`. `interrupt` is called every so often while the file is read (a stop request raises out of it).
    Raises NvidiaPickleError (one line of printable text, at most MAX_MESSAGE_CHARS) or OSError."""
    f.seek(0)
    data = f.read()
    load = _Load(len(data), interrupt)
    try:
        snapshot = _unpickle(data, load)
        del data
        if not isinstance(snapshot, dict) or not any(key in snapshot for key in _SNAPSHOT_NETWORKS):
            raise _Refused(f'is not a StyleGAN2 snapshot of NVIDIA\'s code (a dict with {", ".join(_SNAPSHOT_NETWORKS)})')
        for key in snapshot:
            if not isinstance(key, str):
                raise _Refused(f'names an entry by {_text(key)}, not by a string as NVIDIA\'s snapshots do')
        result = dnnlib.EasyDict(training_set_kwargs=None)
        for key, value in snapshot.items():
            if key in _SNAPSHOT_NETWORKS:
                if value is not None:
                    result[key] = _network(value, key, _SNAPSHOT_NETWORKS[key], load)
            elif key == 'training_set_kwargs' and value is not None:
                result[key] = _training_set_kwargs(value, dropped, path_or_url, load)
            elif value is not None:
                what = _module_of(value.module_src).qualname(value.class_name) if isinstance(value, _Persistent) else \
                    type(value).__name__.strip('_').lower()
                dropped(_one_line(f'{path_or_url}: dropped {_text(key)} ({what}): this project does not use it'))
    except _Refused as e:
        raise NvidiaPickleError(_one_line(f'{path_or_url}: refused to load: {e}; nothing in it was run')) from None
    return result


def _training_set_kwargs(value: Any, dropped: Callable[[str], None], path: str, load: _Load) -> dnnlib.EasyDict | None:
    """NVIDIA's ImageFolderDataset kwargs name ours (dnnlib.util.RENAMED_CLASSES) and take the same arguments."""
    kwargs = _plain(value, 'training_set_kwargs', load)
    try:
        return dnnlib.util.check_class_kwargs(kwargs, 'training_set_kwargs')
    except dnnlib.util.ConfigError as e:
        dropped(_one_line(f'{path}: dropped training_set_kwargs: {dnnlib.util.first_line(e, 200)}'))
        return None
