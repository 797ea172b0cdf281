"""Type stubs of the kvhal package (the C extension kvhal._kvhal)."""
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, final, overload
from array import array


# ---- the core binding (checked by `python3 -m mypy.stubtest kvhal`, test stubtest of suite python) ----
_ArrayLike = Any  # any object with __dlpack__ / __dlpack_device__
_StreamLike = Union[None, int, "Stream", Any]  # int handle, __cuda_stream__ or .cuda_stream objects
_IntArray = Union["Pages", array, Sequence[int], Any]  # host integers: buffer protocol, 1-D DLPack (torch), ints
_DtypeLike = Union[str, Any]  # a kvhal name ('f16'), NumPy's or torch's ('float16', numpy.float16, torch.float16)

__version__: str
STREAM_LEGACY: int
STREAM_PER_THREAD: int
STATUS_ERRORS: Dict[str, type]

class Error(Exception):
    """A kvhal call failed; .status is the status name, the message is kvhal_last_error()."""
    status: Optional[str]

class InvalidArgument(Error, ValueError):
    status: str
    code: int

class OutOfRange(Error, IndexError):
    status: str
    code: int

class OutOfMemory(Error, MemoryError):
    status: str
    code: int

class NoDevice(Error):
    status: str
    code: int

class BackendUnavailable(Error):
    status: str
    code: int

class Unsupported(Error):
    status: str
    code: int

class DeviceMismatch(Error):
    status: str
    code: int

class ShapeMismatch(Error):
    status: str
    code: int

class DtypeMismatch(Error):
    status: str
    code: int

class BackendError(Error):
    status: str
    code: int

class DeviceFault(Error):
    status: str
    code: int

class NotFound(Error):
    status: str
    code: int

class Busy(Error):
    status: str
    code: int

class AbiMismatch(Error):
    status: str
    code: int

class LoadFailed(Error):
    status: str
    code: int

class InvalidHandle(Error):
    status: str
    code: int

class Integrity(Error):
    status: str
    code: int

class ParseError(Error):
    status: str
    code: int

class Internal(Error):
    status: str
    code: int

class Timeout(Error):
    status: str
    code: int

class PeerFailed(Error):
    status: str
    code: int

class Canceled(Error):
    status: str
    code: int


@final
class Tensor:
    """A kvhal tensor: kvhal.empty (kvhal owns the memory) or kvhal.from_dlpack (a zero-copy view)."""
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]
    dtype: str
    device: str
    offset: int
    def __dlpack__(self, *, stream: Optional[int] = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def copy_from(self, src: _ArrayLike) -> None:
        """Copies a contiguous host array of the same byte size into this contiguous tensor."""
    def copy_to(self, dst: _ArrayLike) -> None:
        """Copies this contiguous tensor into a contiguous writable host array of the same byte size."""

@final
class Stream:
    """Borrows a native stream of a device (never destroyed by kvhal)."""
    device: str
    native: int
    def __init__(self, device: str, native: Any = 0) -> None: ...
    def check_errors(self) -> None:
        """Waits for this stream only; raises DeviceFault if a kernel skipped out-of-range indices."""
    def synchronize(self) -> None: ...
    def __cuda_stream__(self) -> Tuple[int, int]: ...

@final
class Pages:
    """Page ids (int32), immutable, returned by match, allocate, evict and reset: len(), indexing, slicing (a new
    Pages), iteration, tolist(), == with a Pages, list, tuple or array.array, and the read-only buffer protocol
    (format 'i': numpy.asarray(pages), memoryview, array.array('i', pages)). kvhal calls take it back with zero
    copies; pickles as array.array('i')."""
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, s: slice) -> "Pages": ...
    def __eq__(self, other: object) -> bool: ...
    def __ne__(self, other: object) -> bool: ...
    def tolist(self) -> List[int]: ...

@final
class PagesView:
    """Page ids (int32) in a CacheManager's own storage (match_view, allocate_view): no copy; read-only; valid
    until the manager's next call of the same kind, which may reuse the memory for other ids."""
    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> int: ...
    def tolist(self) -> List[int]: ...

@final
class PrefixHandle:
    """The deepest node a match reached; valid with the cache that made it."""

@final
class PrefixCache:
    page_size: int
    def __init__(self, kind: str = "radix", page_size: int = 1) -> None: ...
    def match(self, tokens: _IntArray) -> Tuple[PrefixHandle, int, Pages]: ...
    def lock(self, handle: Optional[PrefixHandle]) -> None: ...
    def unlock(self, handle: Optional[PrefixHandle]) -> None: ...
    def insert(self, tokens: _IntArray, pages: _IntArray) -> int: ...
    def evict(self, num_tokens: int) -> Pages: ...
    def reset(self) -> Pages: ...
    def size_info(self) -> Dict[str, int]: ...
    def check_integrity(self) -> None: ...

class CacheManager:
    available: int
    num_free: int
    pages_evicted: int
    page_size: int
    prefix: PrefixCache
    def __init__(self, total_pages: int, page_size: int = 1, kind: str = "radix") -> None: ...
    def match(self, tokens: _IntArray) -> Tuple[PrefixHandle, int, Pages]: ...
    def lock(self, handle: Optional[PrefixHandle]) -> None: ...
    def unlock(self, handle: Optional[PrefixHandle]) -> None: ...
    def allocate(self, n: int) -> Pages: ...
    def match_view(self, tokens: _IntArray) -> Tuple[PrefixHandle, int, PagesView]:
        """match, the pages a view of the manager's own storage (valid until the next match_view)."""
    def allocate_view(self, n: int) -> PagesView:
        """allocate, the pages a view of the manager's own storage (valid until the next allocate_view)."""
    def admit_view(self, tokens: _IntArray, extra_tokens: int = 0) -> Tuple[PrefixHandle, int, PagesView]:
        """Admits a request in one call: match + lock, then the pages for the uncached rest of tokens plus
        extra_tokens (all or nothing: kvhal.OutOfMemory, nothing kept). pages: one view of the manager's own
        storage, the matched page ids then the new ones (valid until the next admit_view)."""
    def free(self, pages: _IntArray) -> None: ...
    def cache_finished(self, tokens: _IntArray, pages: _IntArray, handle: Optional[PrefixHandle]) -> None: ...
    def cache_finished_suffix(self, handle: Optional[PrefixHandle], tokens: _IntArray, pages: _IntArray,
                              start: int = 0) -> None:
        """cache_finished given what follows the match: tokens[start:] (pass the whole request and start=the
        matched length to avoid slicing it) and their pages (admit_view's row as it came: start is then its
        cached_len, and the pages past the match are taken)."""
    def evict(self, num_tokens: int) -> int: ...
    def check_integrity(self) -> None: ...

def paged_caching(k_cache: _ArrayLike, v_cache: Optional[_ArrayLike], k: _ArrayLike, v: _ArrayLike,
                  slot_mapping: _ArrayLike,
                  k_scale: Union[float, _ArrayLike] = 1.0, v_scale: Union[float, _ArrayLike] = 1.0,
                  stream: _StreamLike = None, cache_dtype: Optional[_DtypeLike] = None,
                  num_tokens: Optional[int] = None, layout: str = "NHD") -> None:
    """cache_dtype: the fp8 format of caches kept as uint8 arrays of codes; num_tokens: only the first rows of k
    and v; layout 'HND': caches [blocks, heads, block_size, dim]; v_cache=None: k_cache is [blocks, 2, ...]."""
def copy_blocks(caches: Sequence[_ArrayLike], pairs: Union[_IntArray, Sequence[Tuple[int, int]]],
                stream: _StreamLike = None) -> None: ...
def tensor_copy(dst: _ArrayLike, src: _ArrayLike, stream: _StreamLike = None) -> None: ...
def empty(shape: Sequence[int], dtype: _DtypeLike = "f32", device: str = "cpu:0") -> Tensor: ...
def from_dlpack(array: _ArrayLike) -> Tensor: ...
def dlpack_path(array: _ArrayLike) -> str:
    """How kvhal imports this array: 'kvhal.Tensor', 'c_exchange_api' (its type offers the DLPack C exchange API,
    __dlpack_c_exchange_api__: no Python call per argument, whatever the call's stream) or '__dlpack__'."""
def devices() -> List[Dict[str, Any]]: ...
def synchronize(device: str = "cpu:0") -> None: ...
def check_errors(device: str = "cpu:0", stream: _StreamLike = None) -> None: ...
def last_error() -> str: ...

# ---- serving objects: paged caches, the host tier, KV events, block pool, device events, MLA ----
from typing import Final, final

@final
class PagedCache:
    num_blocks: int
    num_layers: int
    num_heads: int
    head_dim: int
    block_size: int
    dtype: str
    device: str
    host_page_bytes: int
    shareable: bool
    layout: str
    order: str
    def __init__(self, num_layers: int, num_heads: int, head_dim: int, block_size: int,
                 num_blocks: Optional[int] = None, dtype: str = "f32", device: str = "cpu:0", layout: str = "nhd",
                 order: str = "layer_first", memory_budget: Optional[int] = None, k_scale: float = 1.0,
                 v_scale: float = 1.0, shareable: bool = False) -> None: ...
    def layer(self, i: int) -> Tuple[Tensor, Tensor]: ...
    def update(self, layer: int, k: _ArrayLike, v: _ArrayLike, slot_mapping: _ArrayLike,
               stream: _StreamLike = None) -> None: ...
    def copy_blocks(self, pairs: _IntArray, stream: _StreamLike = None) -> None: ...

@final
class KVEvent(Tuple[Any, ...]):
    """One KV event: kind 'stored' | 'removed' | 'cleared' | 'overflow', tier 'device' | 'host'."""
    __match_args__: Final = ("kind", "tier", "hash", "parent_hash", "page", "tokens", "dropped")
    n_fields: int
    n_sequence_fields: int
    n_unnamed_fields: int
    @property
    def kind(self) -> str: ...
    @property
    def tier(self) -> str: ...
    @property
    def hash(self) -> int: ...
    @property
    def parent_hash(self) -> int: ...
    @property
    def page(self) -> int: ...
    @property
    def tokens(self) -> Tuple[int, ...]: ...
    @property
    def dropped(self) -> int: ...

@final
class TieredCacheManager(CacheManager):
    cache: PagedCache
    policy: str
    host_budget: int
    event_capacity: int
    def __init__(self, cache: PagedCache, total_pages: Optional[int] = None, kind: str = "radix",
                 host_pages: Optional[int] = None, host_budget: Optional[int] = None,
                 policy: str = "write_through", stream: Optional[Stream] = None,
                 event_capacity: int = 0) -> None: ...
    def match_tiered(self, tokens: _IntArray) -> Tuple[PrefixHandle, int, int, Pages]:
        """(handle, device_len, host_len, pages): the device match and how far the host tier continues it."""
    def load_back(self, handle: PrefixHandle, tokens: _IntArray) -> Pages: ...
    def transfer_wait(self) -> None: ...
    def transfer_query(self) -> bool: ...
    def stats(self) -> Dict[str, int]: ...
    def host_tier_clear(self) -> None: ...
    def events(self, max: Optional[int] = None) -> List[KVEvent]: ...

@final
class BlockPool:
    num_free: int
    num_total: int
    def __init__(self, num_blocks: int) -> None: ...
    def allocate(self, n: int) -> Pages: ...
    def share(self, blocks: Union[int, _IntArray]) -> None: ...
    def release(self, blocks: Union[int, _IntArray]) -> None: ...
    def ref_count(self, block: int) -> int: ...
    def check_integrity(self) -> None: ...

@final
class Event:
    device: str
    def __init__(self, device: str = "cpu:0") -> None: ...
    def record(self, stream: _StreamLike = None) -> None: ...
    def wait(self, stream: _StreamLike = None) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...

def paged_caching_mla(kv_cache: _ArrayLike, kv_c: _ArrayLike, k_pe: Optional[_ArrayLike], slot_mapping: _ArrayLike,
                      scale: float = 1.0, stream: _StreamLike = None) -> None: ...
def kv_root_hash(page_size: int) -> int: ...
def kv_page_hash(parent: int, tokens: _IntArray) -> int: ...
