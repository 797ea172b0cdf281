"""A Hugging Face transformers causal LM generating with its KV pages in kvhal.

- Pages: a kvhal.CacheManager with the radix policy allocates every page (a kvhal.TieredCacheManager with a host
  tier when host_pages is given). A request whose prompt prefix is cached computes only the tokens past it (match
  and lock at admission; host-tier pages come back by load-back); a prompt's whole pages enter the prefix cache as
  soon as its prefill is done, and a finished request inserts the rest (cache_finished_suffix).
- Storage: a kvhal.PagedCache per model, each layer's K and V [pages, page_size, kv_heads, head_dim] seen by torch as
  zero-copy views (torch.from_dlpack).
- Writes: kvhal.paged_caching(k_cache, v_cache, k, v, slot_mapping) writes the step's new tokens of every request,
  from inside the attention function, on torch's current stream.
- Attention: kvhal_paged_attention, registered with transformers' public AttentionInterface under "kvhal_paged"
  (register()); the model, its layers and weights stay transformers' own. A step's metadata (a KvhalBatch) travels
  as the forward keyword argument ``kvhal_batch``, which transformers passes down to the attention function. It
  reads each request's tokens through one index_select per layer (a copy; torch has no variable-length flash
  attention over a block table) and attends with one variable-length flash call (half precision on CUDA) or
  request by request with scaled_dot_product_attention.
- Scheduling: KvhalEngine batches continuously (admission while pages and batch slots allow, decode tokens then
  prompt chunks under a per-step token budget), packs a step into one sequence of shape [1, tokens] with explicit
  position ids, keeps the running requests' token slots in rows on the device (a step's slots and read index are
  one gather each), and decodes greedily.

transformers is imported only by register() (and by callers' model code), so this module imports without it.
"""
import time
import warnings

import torch
import torch.nn.functional as F

import kvhal

__all__ = ["ATTN_NAME", "PagedKVCache", "KvhalBatch", "kvhal_paged_attention", "register", "set_attention",
           "Request", "KvhalEngine", "ideal_hit_rate", "kvhal_device"]

ATTN_NAME = "kvhal_paged"
_HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")
_TV = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2] if x.isdigit())
_HAVE_GQA = _HAVE_SDPA and _TV >= (2, 5)
_KV_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
try:  # torch's variable-length flash attention (torch >= 2.10, CUDA, half precision)
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
except ImportError:  # pragma: no cover - depends on the torch build
    _varlen_attn = None


def kvhal_device(dev):
    """kvhal's name ("cpu:0", "cuda:1", ...) of a torch device or device string."""
    dev = torch.device(dev)
    return "cpu:0" if dev.type == "cpu" else f"{dev.type}:{dev.index if dev.index is not None else 0}"


def _positive(name, value):
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


class PagedKVCache:
    """A model's K/V pages: a kvhal.PagedCache (the object kvhal's host tier and transfer agent work on), its layers
    seen by torch as zero-copy views.

    ``pc`` is the kvhal.PagedCache; ``k[l]`` and ``v[l]`` are torch views of layer l's
    [pages, page_size, kv_heads, head_dim] K and V (torch.from_dlpack of pc.layer(l): the same memory).
    shareable: allocated so that another process of the host can map it (the transfer agent's GPU IPC path).
    """

    def __init__(self, num_layers, num_pages, page_size, kv_heads, head_dim, dtype, device, shareable=False):
        for name, value in (("num_layers", num_layers), ("num_pages", num_pages), ("page_size", page_size),
                            ("kv_heads", kv_heads), ("head_dim", head_dim)):
            _positive(name, value)
        if dtype not in _KV_DTYPES:
            raise TypeError(f"dtype must be one of {', '.join(str(d) for d in _KV_DTYPES)}, got {dtype}")
        self.num_layers, self.num_pages, self.page_size = num_layers, num_pages, page_size
        self.kv_heads, self.head_dim, self.dtype = kv_heads, head_dim, dtype
        self.pc = kvhal.PagedCache(num_layers, kv_heads, head_dim, page_size, num_blocks=num_pages,
                                   dtype=_KV_DTYPES[dtype], device=kvhal_device(device), shareable=shareable)
        self.k, self.v = [], []
        want = (num_pages, page_size, kv_heads, head_dim)
        for layer in range(num_layers):
            k, v = (torch.from_dlpack(t) for t in self.pc.layer(layer))  # zero-copy views
            if k.dtype != dtype or tuple(k.shape) != want or tuple(v.shape) != want:
                raise RuntimeError(f"torch sees kvhal's layer {layer} as {k.dtype} {tuple(k.shape)}, expected "
                                   f"{dtype} {want}")
            self.k.append(k)
            self.v.append(v)

    @property
    def nbytes(self):
        """Size of the page pool in bytes."""
        return 2 * self.num_layers * self.k[0].numel() * self.k[0].element_size()


class KvhalBatch:
    """One forward step's metadata, passed as ``model(..., kvhal_batch=...)`` and read by the attention function.

    cache: the PagedKVCache; slots: int64 tensor, the page slot (page * page_size + offset) of every new token;
    read_idx: int64 tensor, the page slot of every token each request attends to, request after request (its
    cached tokens, then the new ones); cu_q / cu_k: int32 tensors [requests + 1], where each request's queries and
    keys start in the packed step and in read_idx; max_q / max_k: their longest spans; seqs: per request a tuple
    (q_start, q_len, k_start, kv_len); stream: the torch stream the writes go on (None on the CPU); varlen: whether
    attention runs as one variable-length flash call per layer (half-precision CUDA) or request by request;
    on_layer: None, or a function called with the layer index right after that layer's writes are enqueued.
    """
    __slots__ = ("cache", "slots", "read_idx", "cu_q", "cu_k", "max_q", "max_k", "seqs", "stream", "varlen",
                 "on_layer")

    def __init__(self, cache, slots, read_idx, cu_q, cu_k, max_q, max_k, seqs, stream, varlen, on_layer=None):
        self.cache, self.slots, self.read_idx = cache, slots, read_idx
        self.cu_q, self.cu_k, self.max_q, self.max_k = cu_q, cu_k, max_q, max_k
        self.seqs, self.stream, self.varlen = seqs, stream, varlen
        self.on_layer = on_layer  # called with the layer index once its writes are enqueued (layer streaming)

    @classmethod
    def from_table(cls, cache, slot_t, table, rows, qlen, kvlen, ql, kl, stream=None, varlen=False):
        """A step from device tensors: slot_t (the new tokens' slots), table (a block table: row i lists a
        request's pages in order), rows / ql / kl (per request: its row, new tokens, tokens after the step) and the
        same qlen / kvlen as host lists. The read index is computed on the device: no per-token work on the host."""
        dev, P, R, K = table.device, cache.page_size, len(qlen), sum(kvlen)
        cu_q = torch.zeros(R + 1, dtype=torch.int32, device=dev)
        cu_k = torch.zeros(R + 1, dtype=torch.int32, device=dev)
        cu_q[1:] = ql.cumsum(0)
        cu_k[1:] = kl.cumsum(0)
        seq = torch.repeat_interleave(torch.arange(R, device=dev), kl, output_size=K)
        j = torch.arange(K, device=dev) - cu_k[:-1].long()[seq]
        read_idx = table[rows[seq], j // P] * P + j % P
        seqs, q0, k0 = [], 0, 0
        for n, kvn in zip(qlen, kvlen):
            seqs.append((q0, n, k0, kvn))
            q0 += n
            k0 += kvn
        return cls(cache, slot_t, read_idx, cu_q, cu_k, max(qlen), max(kvlen), seqs, stream, varlen)

    @classmethod
    def from_lists(cls, cache, slots, pages, qlen, kvlen, device, stream=None, varlen=False):
        """The same from host lists: slots of the new tokens, and per request its pages (each request's new tokens
        come last among its kv_len tokens)."""
        t = lambda x: torch.tensor(x, dtype=torch.int64, device=device)  # noqa: E731
        width = max(len(p) for p in pages)
        table = t([list(p) + [0] * (width - len(p)) for p in pages])
        return cls.from_table(cache, t(slots), table, t(list(range(len(pages)))), qlen, kvlen, t(qlen), t(kvlen),
                              stream, varlen)


def _repeat_kv(x, n):
    if n == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)


def _sdpa(q, k, v, mask, causal, scaling, groups):
    """Attention of q [1, H, q, D] over k, v [1, KVH, kv, D], as transformers' sdpa path calls torch (grouped heads
    natively without a mask, repeated heads with one); plain math on torch without scaled_dot_product_attention."""
    if _HAVE_SDPA:
        if mask is None and _HAVE_GQA:
            return F.scaled_dot_product_attention(q, k, v, scale=scaling, is_causal=causal, enable_gqa=True)
        k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
        kw = {"scale": scaling} if _TV >= (2, 1) else {}
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None, **kw)
    k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
    s = torch.matmul(q, k.transpose(-1, -2)) * (scaling if scaling is not None else q.shape[-1] ** -0.5)
    if causal and mask is None:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    return torch.matmul(p, v)


def kvhal_paged_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                          kvhal_batch=None, **kwargs):
    """transformers attention function (AttentionInterface) over kvhal's pages.

    query is [1, H, T, D] and key/value [1, KVH, T, D] for the step's T packed tokens, rotary embedding applied.
    Writes the new K/V into layer ``module.layer_idx``'s pages with kvhal.paged_caching, reads every request's
    tokens back through the page table (one index_select of the step's tokens per layer: a copy, as transformers'
    own paged path makes), then attends: one variable-length flash call for the whole step in half precision on
    CUDA, request by request with scaled_dot_product_attention otherwise. Returns ([1, T, H, D], None).
    """
    b = kvhal_batch
    if not isinstance(b, KvhalBatch):
        raise TypeError("kvhal_paged attention needs the forward keyword argument kvhal_batch (a KvhalBatch), got "
                        f"{type(b).__name__}")
    layer = module.layer_idx
    kc, vc = b.cache.k[layer], b.cache.v[layer]
    # [T, KVH, D] strided views of the new tokens: kvhal takes any strides, nothing is copied
    kvhal.paged_caching(kc, vc, key[0].transpose(0, 1), value[0].transpose(0, 1), b.slots, stream=b.stream)
    if b.on_layer is not None:
        b.on_layer(layer)
    kg = kc.flatten(0, 1).index_select(0, b.read_idx)  # [sum of kv_len, KVH, D]
    vg = vc.flatten(0, 1).index_select(0, b.read_idx)
    _, heads, tokens, dim = query.shape
    if b.varlen:
        q = query[0].transpose(0, 1).contiguous()  # [T, H, D]
        o = _varlen_attn(q, kg, vg, b.cu_q, b.cu_k, b.max_q, b.max_k, scale=scaling, window_size=(-1, 0))
        return o.unsqueeze(0), None
    groups = heads // kc.shape[2]
    out = query.new_empty((1, tokens, heads, dim))
    for q0, qn, k0, kvn in b.seqs:
        q = query[:, :, q0:q0 + qn]
        k = kg[k0:k0 + kvn].transpose(0, 1).unsqueeze(0).contiguous()
        v = vg[k0:k0 + kvn].transpose(0, 1).unsqueeze(0).contiguous()
        mask = None
        if 1 < qn < kvn:  # a chunk after cached tokens: causal, aligned bottom-right
            mask = (torch.arange(kvn, device=q.device)[None, :] <=
                    torch.arange(kvn - qn, kvn, device=q.device)[:, None])
        o = _sdpa(q, k, v, mask, qn > 1 and mask is None, scaling, groups)
        out[0, q0:q0 + qn] = o[0].transpose(0, 1)
    return out, None


def register():
    """Registers kvhal_paged_attention with transformers' AttentionInterface under ATTN_NAME ("kvhal_paged")."""
    from transformers import AttentionInterface
    AttentionInterface.register(ATTN_NAME, kvhal_paged_attention)


def set_attention(model, name):
    """Switches a transformers model's attention implementation (its public set_attn_implementation where it has
    one and accepts the name; otherwise the config's _attn_implementation)."""
    if hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation(name)
            return
        except Exception as e:  # noqa: BLE001 - transformers versions raise different types here
            warnings.warn(f"set_attn_implementation({name!r}) refused ({type(e).__name__}: {e}); setting the config",
                          stacklevel=2)
    model.config._attn_implementation = name


class Request:
    """One request of a KvhalEngine: its prompt, how many tokens to generate, and (as it runs) its output tokens,
    its pages, how many of its prompt tokens its prefix-cache handle covers on the device (``cached``) and how many
    came back from the host tier after them (``host``)."""
    __slots__ = ("rid", "prompt", "max_new", "out", "handle", "cached", "host", "pages", "own", "kv_len",
                 "logits", "reserve", "key", "t_first", "row", "synced")

    def __init__(self, rid, prompt, max_new, key):
        self.rid, self.prompt, self.max_new, self.key = rid, list(prompt), max_new, key
        self.out, self.logits = [], []
        self.handle, self.cached, self.host, self.pages, self.own = None, 0, 0, [], []
        self.kv_len, self.reserve, self.t_first = 0, 0, None
        self.row, self.synced = None, 0  # its row of the engine's device block table, and how much of it is written


def _common_pages(a, b, n, page):
    """Tokens in whole pages that a and b share from the start (at most n)."""
    k = 0
    while k + page <= n and a[k:k + page] == b[k:k + page]:
        k += page
    return k


class KvhalEngine:
    """Serves requests on a transformers causal LM (or any module with the same forward convention) with its KV in
    kvhal: continuous batching, radix prefix reuse, chunked prefill, greedy decoding.

    The model's attention implementation must be ATTN_NAME (register() then set_attention(model, ATTN_NAME)); its
    forward must accept input_ids, position_ids, use_cache, logits_to_keep and pass kvhal_batch to attention.

    - num_pages pages of page_size tokens are allocated once; at most max_batch requests run at a time.
    - A step computes at most max_step_tokens tokens (None: no limit): decode tokens first, then prompt chunks of
      at most prefill_chunk tokens per request (None: whole prompts) in admission order.
    - share_running: a prompt's whole pages enter the prefix cache as soon as its prefill is done (not only when
      the request finishes), and a waiting request whose prefix a running request is computing waits for it
      instead of computing it again, so requests that run at the same time share their prefixes.
    - attention: "varlen" (one variable-length flash call per layer; CUDA, float16/bfloat16), "sdpa" (request by
      request) or "auto" (varlen where it applies).
    - host_pages: a host tier of that many pages under the device pool (kvhal.TieredCacheManager, write-through:
      every page entering the prefix cache is copied to the host on the step's stream); a request whose prefix the
      device evicted but the host holds gets it back by load-back instead of computing it. event_capacity keeps
      that many KV events (stored / removed, per tier) for events().
    - record_logits keeps each emitted token's logits row in Request.logits (on the CPU).
    """

    def __init__(self, model, num_pages=2048, page_size=16, max_batch=8, prefill_chunk=None, max_step_tokens=None,
                 share_running=True, attention="auto", host_pages=None, event_capacity=0, record_logits=False,
                 device=None, dtype=None, shareable=False):
        _positive("num_pages", num_pages)
        _positive("page_size", page_size)
        _positive("max_batch", max_batch)
        for name, value in (("prefill_chunk", prefill_chunk), ("max_step_tokens", max_step_tokens),
                            ("host_pages", host_pages)):
            if value is not None:
                _positive(name, value)
        if attention not in ("auto", "varlen", "sdpa"):
            raise ValueError(f"attention must be 'auto', 'varlen' or 'sdpa', got {attention!r}")
        cfg = model.config
        self.model = model
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.dtype = dtype if dtype is not None else next(model.parameters()).dtype
        varlen_ok = (_varlen_attn is not None and self.device.type == "cuda" and
                     self.dtype in (torch.float16, torch.bfloat16))
        if attention == "varlen" and not varlen_ok:
            raise ValueError("attention='varlen' needs torch.nn.attention.varlen, a CUDA device and float16 or "
                             f"bfloat16 (have {self.device}, {self.dtype}, varlen "
                             f"{'present' if _varlen_attn is not None else 'absent'})")
        self.varlen = attention == "varlen" or (attention == "auto" and varlen_ok)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.cache = PagedKVCache(cfg.num_hidden_layers, num_pages, page_size, cfg.num_key_value_heads, head_dim,
                                  self.dtype, self.device, shareable=shareable)
        self.stream = None
        if self.device.type == "cuda":  # kvhal's view of torch's stream: writes and tier copies in torch's order
            self.stream = kvhal.Stream(kvhal_device(self.device),
                                       native=torch.cuda.current_stream(self.device).cuda_stream)
        self.tiered = host_pages is not None or event_capacity > 0
        if self.tiered:
            self.cm = kvhal.TieredCacheManager(self.cache.pc, total_pages=num_pages, kind="radix",
                                               host_pages=host_pages or 0, policy="write_through",
                                               stream=self.stream, event_capacity=event_capacity)
        else:
            self.cm = kvhal.CacheManager(num_pages, page_size, "radix")
        self.P, self.max_batch, self.chunk, self.record = page_size, max_batch, prefill_chunk, record_logits
        self.max_step_tokens, self.share_running = max_step_tokens, share_running
        self.admit_window = 4 * max_batch  # waiting requests looked at per step when the first ones must wait
        self.on_layer = None  # a layer hook for every step's KvhalBatch (the prefill side of a disaggregated pair)
        # The running requests' token slots on the device, a row each (row r, column j: the slot of token j of the
        # request in row r, page(j // page_size) * page_size + j % page_size), written a page at a time where its
        # pages changed. A step's slots and read index are single gathers from it.
        self.slot_rows = torch.zeros((max_batch, 64 * page_size), dtype=torch.int64, device=self.device)
        self._arange = torch.arange(max(8192, 64 * page_size), dtype=torch.int64, device=self.device)
        self._rows = list(range(max_batch - 1, -1, -1))
        self.waiting, self.running, self.done = [], [], []
        self.reserved = 0  # pages promised to running requests' future decode tokens
        self.stats = dict(requests=0, prompt_tokens=0, cached_tokens=0, host_tokens=0, prefill_computed=0,
                          output_tokens=0, steps=0, max_step_tokens=0, host_s=0.0, cm_s=0.0, table_s=0.0,
                          waits_for_prefix=0)
        self._rid = 0

    def add(self, prompt, max_new_tokens):
        """Queues a request (prompt: a sequence of token ids) and returns its Request."""
        prompt = list(prompt)
        if not prompt:
            raise ValueError("prompt must hold at least one token")
        _positive("max_new_tokens", max_new_tokens)
        r = Request(self._rid, prompt, max_new_tokens, tuple(prompt[:self.P]))
        self._rid += 1
        self.waiting.append(r)
        return r

    def _pages_for(self, n):
        return -(-n // self.P)

    def _computing_prefix(self, r):
        """Whether a running request is computing (has not yet cached) whole pages r's prompt starts with."""
        n = len(r.prompt) - 1
        for s in self.running:
            if s.key == r.key and s.kv_len < len(s.prompt) and \
                    _common_pages(r.prompt, s.prompt, min(n, len(s.prompt)), self.P) > s.cached:
                return True
        return False

    def _admit(self):
        i = 0
        while i < len(self.waiting) and len(self.running) < self.max_batch and i < self.admit_window:
            r = self.waiting[i]
            if self.share_running and len(r.prompt) > self.P and self._computing_prefix(r):
                self.stats["waits_for_prefix"] += 1
                i += 1
                continue
            t = time.perf_counter()
            if self.tiered:  # the last prompt token is always computed
                handle, cached, on_host, pages = self.cm.match_tiered(r.prompt[:-1])
            else:
                (handle, cached, pages), on_host = self.cm.match(r.prompt[:-1]), 0
            need = self._pages_for(len(r.prompt)) - len(pages)  # load-back's pages included
            future = self._pages_for(len(r.prompt) + r.max_new - 1) - self._pages_for(len(r.prompt))
            if self.cm.available - self.reserved < need + future:
                self.cm.unlock(handle)
                self.stats["cm_s"] += time.perf_counter() - t
                if not self.running:
                    raise kvhal.OutOfMemory(f"request {r.rid} needs {need + future} pages, the pool cannot hold it")
                return
            # host pages past the device match come back by copies on the step's stream, ordered before the forward
            loaded = list(self.cm.load_back(handle, r.prompt[:-1])) if on_host else []
            own = loaded + list(self.cm.allocate(need - len(loaded)))
            self.stats["cm_s"] += time.perf_counter() - t
            self.waiting.pop(i)
            r.handle, r.cached, r.host, r.pages, r.own = handle, cached, len(loaded) * self.P, list(pages) + own, own
            r.kv_len = cached + r.host
            r.reserve = future
            self.reserved += future
            self.running.append(r)
            self.stats["requests"] += 1
            self.stats["prompt_tokens"] += len(r.prompt)
            self.stats["cached_tokens"] += cached
            self.stats["host_tokens"] += r.host

    def _cache_prompt(self, r):
        """r's prefill is done: its prompt's whole pages enter the prefix cache now, locked for r (pages another
        request inserted meanwhile replace r's copies, which go back to the pool)."""
        aligned = len(r.prompt) // self.P * self.P
        if aligned <= r.cached:
            return
        n = aligned // self.P
        t = time.perf_counter()
        self.cm.cache_finished(r.prompt[:aligned], r.pages[:n], r.handle)
        r.handle, got, pages = self.cm.match(r.prompt[:aligned])
        self.stats["cm_s"] += time.perf_counter() - t
        if got != aligned:
            raise kvhal.Internal(f"request {r.rid}: {aligned} prompt tokens inserted, {got} matched back")
        r.pages[:n] = list(pages)
        r.own = r.pages[n:]
        r.synced = 0  # its row is written again
        r.cached = aligned

    def _finish(self, r):
        kv_tokens = (r.prompt + r.out)[:r.kv_len]
        t = time.perf_counter()
        self.cm.cache_finished_suffix(r.handle, kv_tokens, r.own, start=r.cached)
        self.stats["cm_s"] += time.perf_counter() - t
        self.reserved -= r.reserve
        r.handle = None
        if r.row is not None:
            self._rows.append(r.row)
            r.row = None
        self.running.remove(r)
        self.done.append(r)

    def _schedule(self):
        """The step: per scheduled request (r, tokens it computes, whether it emits), and what _batch sends."""
        P = self.P
        budget = self.max_step_tokens if self.max_step_tokens is not None else 1 << 62
        work = []
        for r in self.running:  # decode tokens first: one each
            if r.kv_len >= len(r.prompt) and budget > 0:
                work.append((r, [r.out[-1]], True))
                budget -= 1
        for r in self.running:  # then prompt chunks
            if r.kv_len < len(r.prompt) and budget > 0:
                n = min(len(r.prompt) - r.kv_len, budget, self.chunk or budget)
                work.append((r, r.prompt[r.kv_len:r.kv_len + n], r.kv_len + n == len(r.prompt)))
                budget -= n
                self.stats["prefill_computed"] += n
        widest = 0
        for r, toks, _ in work:
            need = (r.kv_len + len(toks) + P - 1) // P
            while len(r.pages) < need:  # a decode crossing into a new (reserved) page
                page = self.cm.allocate(1)[0]
                r.pages.append(page)
                r.own.append(page)
                r.reserve -= 1
                self.reserved -= 1
            if need > widest:
                widest = need
        if widest * P > self.slot_rows.shape[1]:
            wider = torch.zeros((self.max_batch, max(2 * self.slot_rows.shape[1], widest * P)), dtype=torch.int64,
                                device=self.device)
            wider[:, :self.slot_rows.shape[1]] = self.slot_rows
            self.slot_rows = wider
        W = self.slot_rows.shape[1]
        # per token: ids, positions, flat indices of their slots in slot_rows; per emitting request: its logits row;
        # per request: row offset of its read index, kv length, cumulative query / key lengths; per changed page:
        # its first flat index in slot_rows and its first slot
        ids, pos, sidx, lidx, roff, kvlen, cu_q, cu_k, ut, uv, seqs = [], [], [], [], [], [], [0], [0], [], [], []
        q0 = k0 = 0
        for r, toks, emits in work:
            n, start = len(toks), r.kv_len
            kv_after = start + n
            if r.row is None:
                r.row, r.synced = self._rows.pop(), 0
            base = r.row * W
            npages = len(r.pages)
            if r.synced < npages:  # the row catches up with the request's pages
                ut += range(base + r.synced * P, base + npages * P, P)
                uv += [page * P for page in r.pages[r.synced:]]
                r.synced = npages
            if emits:
                lidx.append(q0 + n - 1)
            seqs.append((q0, n, k0, kv_after))
            ids += toks
            pos += range(start, kv_after)
            sidx += range(base + start, base + kv_after)
            roff.append(base - k0)
            kvlen.append(kv_after)
            q0 += n
            k0 += kv_after
            cu_q.append(q0)
            cu_k.append(k0)
        return work, ids, pos, sidx, lidx, roff, kvlen, cu_q, cu_k, ut, uv, seqs

    def _batch(self, ids, pos, sidx, lidx, roff, kvlen, cu_q, cu_k, ut, uv, seqs):
        """One host-to-device copy of the step's lists; the changed pages' slots go into slot_rows, and the new
        tokens' slots and the read index are one gather each from it: a handful of launches whatever the batch."""
        T, R, U, K = len(ids), len(roff), len(ut), cu_k[-1]
        buf = torch.tensor(ids + pos + sidx + lidx + roff + kvlen + ut + uv + cu_q + cu_k, dtype=torch.int64)
        buf = buf.to(self.device, non_blocking=True)
        o = [0]
        for n in (T, T, T, len(lidx), R, R, U, U, 2 * R + 2):
            o.append(o[-1] + n)
        input_ids, position_ids, sidx_t, logits_idx, roff_t, kl, ut_t, uv_t, cu = (buf[o[i]:o[i + 1]]
                                                                                   for i in range(9))
        flat = self.slot_rows.view(-1)
        if U:
            offs = self._arange[:self.P]
            flat[(ut_t[:, None] + offs).view(-1)] = (uv_t[:, None] + offs).view(-1)
        if K > self._arange.numel():
            self._arange = torch.arange(2 * K, dtype=torch.int64, device=self.device)
        slots = flat[sidx_t]
        read_idx = flat[torch.repeat_interleave(roff_t, kl, output_size=K) + self._arange[:K]]
        cu = cu.to(torch.int32)
        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        batch = KvhalBatch(self.cache, slots, read_idx, cu[:R + 1], cu[R + 1:], max(q for _, q, _, _ in seqs),
                           max(kvlen), seqs, stream, self.varlen, self.on_layer)
        return input_ids.view(1, T), position_ids.view(1, T), logits_idx, batch

    def step(self):
        """Admits what fits, runs one forward over every running request, emits tokens, finishes requests.
        Returns False when nothing was left to run."""
        t_host = time.perf_counter()
        self._admit()
        if not self.running:
            return False
        return self._forward_step(t_host)

    @torch.no_grad()
    def _forward_step(self, t_host):
        t_table = time.perf_counter()
        work, *lists = self._schedule()
        input_ids, position_ids, logits_idx, batch = self._batch(*lists)
        now = time.perf_counter()
        self.stats["table_s"] += now - t_table  # the step's page tables, slots and read index
        self.stats["host_s"] += now - t_host
        out = self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False, kvhal_batch=batch,
                         logits_to_keep=logits_idx)
        logits = out.logits[0] if hasattr(out, "logits") else out[0]
        next_ids = logits.argmax(-1)
        if self.device.type == "cuda":  # wait with the GIL released (other threads run meanwhile)
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
            done.synchronize()
        next_tokens = next_ids.tolist()
        rows = logits.float().cpu() if self.record else None
        t_host = time.perf_counter()
        i = 0
        for r, toks, emits in work:
            r.kv_len += len(toks)
            if not emits:
                continue
            if not r.out and self.share_running:
                self._cache_prompt(r)
            r.out.append(next_tokens[i])
            if self.record:
                r.logits.append(rows[i])
            i += 1
            self.stats["output_tokens"] += 1
            if len(r.out) >= r.max_new:
                self._finish(r)
        self.stats["steps"] += 1
        self.stats["max_step_tokens"] = max(self.stats["max_step_tokens"], input_ids.shape[1])
        self.stats["host_s"] += time.perf_counter() - t_host
        return True

    def run(self):
        """Steps until every queued request has finished; returns the finished requests in finishing order."""
        while self.waiting or self.running:
            self.step()
        return self.done

    def hit_rate(self):
        """Share of admitted prompt tokens served from the prefix cache (device and host tier)."""
        return (self.stats["cached_tokens"] + self.stats["host_tokens"]) / max(1, self.stats["prompt_tokens"])

    def events(self, max=None):  # noqa: A002 - the binding's name
        """The KV events kept since the last call (kvhal.KVEvent records), with event_capacity > 0."""
        if not self.tiered:
            raise kvhal.InvalidArgument("events: the engine was made without event_capacity or host_pages")
        return self.cm.events(max)

    def tier_stats(self):
        """The host tier's counters (pages written, loaded back, host evictions, ...)."""
        return self.cm.stats() if self.tiered else {}


def ideal_hit_rate(prompts, page_size):
    """The hit rate of an unbounded cache with insertion at finish and requests in queue order: per prompt, the
    longest page-aligned prefix of prompt[:-1] shared with an earlier prompt (an upper bound; requests running at
    the same time lower it)."""
    _positive("page_size", page_size)
    hit = tot = 0
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            n = 0
            m = min(len(p) - 1, len(q))
            while n < m and p[n] == q[n]:
                n += 1
            best = max(best, n - n % page_size)
        hit += best
        tot += len(p)
    return hit / max(1, tot)
