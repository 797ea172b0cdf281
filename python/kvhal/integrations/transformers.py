"""A Hugging Face transformers causal LM generating with its KV pages in kvhal.

- Pages: a kvhal.CacheManager with the radix policy allocates every page. A request whose prompt prefix is cached
  computes only the tokens past it (match and lock at admission); a finished request inserts its pages into the
  prefix cache (cache_finished_suffix).
- Storage: one kvhal-allocated tensor per model, kvhal.empty([layers, 2, pages, page_size, kv_heads, head_dim]),
  seen by torch as a zero-copy view (torch.from_dlpack); layer l's K and V caches are views [l, 0] and [l, 1].
- Writes: kvhal.paged_caching(k_cache, v_cache, k, v, slot_mapping) writes the step's new tokens of every request,
  from inside the attention function, on torch's current stream.
- Attention: kvhal_paged_attention, registered with transformers' public AttentionInterface under "kvhal_paged"
  (register()); the model, its layers and weights stay transformers' own. A step's metadata (a KvhalBatch) travels
  as the forward keyword argument ``kvhal_batch``, which transformers passes down to the attention function.
- Scheduling: KvhalEngine batches continuously (admission while pages and batch slots allow, prefill and decode
  tokens in one step, optional chunked prefill), packs a step into one sequence of shape [1, tokens] with explicit
  position ids, and decodes greedily.

What it does not do yet: attention gathers each request's pages through its block table with index_select (a copy
of the pages it reads) and runs torch's scaled_dot_product_attention per request, rather than a paged-attention
kernel reading the pages in place; pages enter the prefix cache only when a request finishes; there is no host
tier, no KV events and no split of prefill and decode onto separate workers.

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
    """A model's K/V pages: one tensor kvhal allocates, viewed by torch without a copy.

    ``storage`` is the kvhal tensor [layers, 2, pages, page_size, kv_heads, head_dim]; ``tensor`` is torch's view of
    the same memory; ``k[l]`` and ``v[l]`` are layer l's [pages, page_size, kv_heads, head_dim] views.
    """

    def __init__(self, num_layers, num_pages, page_size, kv_heads, head_dim, dtype, device):
        for name, value in (("num_layers", num_layers), ("num_pages", num_pages), ("page_size", page_size),
                            ("kv_heads", kv_heads), ("head_dim", head_dim)):
            _positive(name, value)
        if dtype not in _KV_DTYPES:
            raise TypeError(f"dtype must be one of {', '.join(str(d) for d in _KV_DTYPES)}, got {dtype}")
        self.num_layers, self.num_pages, self.page_size = num_layers, num_pages, page_size
        self.kv_heads, self.head_dim, self.dtype = kv_heads, head_dim, dtype
        self.storage = kvhal.empty((num_layers, 2, num_pages, page_size, kv_heads, head_dim), _KV_DTYPES[dtype],
                                   kvhal_device(device))
        self.tensor = torch.from_dlpack(self.storage)  # zero-copy: the same memory as self.storage
        if self.tensor.dtype != dtype or tuple(self.tensor.shape) != tuple(self.storage.shape):
            raise RuntimeError(f"torch sees kvhal's pages as {self.tensor.dtype} {tuple(self.tensor.shape)}, "
                               f"expected {dtype} {tuple(self.storage.shape)}")
        self.k = [self.tensor[i, 0] for i in range(num_layers)]
        self.v = [self.tensor[i, 1] for i in range(num_layers)]

    @property
    def nbytes(self):
        """Size of the page pool in bytes."""
        return self.tensor.numel() * self.tensor.element_size()


class KvhalBatch:
    """One forward step's metadata, passed as ``model(..., kvhal_batch=...)`` and read by the attention function.

    cache: the PagedKVCache; slots: int64 tensor, the page slot (page * page_size + offset) of every new token;
    blocks: int64 tensor, the block tables of the step's requests concatenated; seqs: per request a tuple
    (q_start, q_len, kv_len after this step, offset of its pages in ``blocks`` times page_size, mask or None);
    stream: the torch stream the writes go on (None on the CPU).
    """
    __slots__ = ("cache", "slots", "blocks", "seqs", "stream")

    def __init__(self, cache, slots, blocks, seqs, stream):
        self.cache, self.slots, self.blocks, self.seqs, self.stream = cache, slots, blocks, seqs, stream


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
    Writes the new K/V into layer ``module.layer_idx``'s pages, then attends each request's queries over its pages
    (gathered with index_select, a copy). Returns ([1, T, H, D], None).
    """
    b = kvhal_batch
    if not isinstance(b, KvhalBatch):
        raise TypeError("kvhal_paged attention needs the forward keyword argument kvhal_batch (a KvhalBatch), got "
                        f"{type(b).__name__}")
    layer = module.layer_idx
    kc, vc = b.cache.k[layer], b.cache.v[layer]
    # [T, KVH, D] strided views of the new tokens: kvhal takes any strides, nothing is copied
    kvhal.paged_caching(kc, vc, key[0].transpose(0, 1), value[0].transpose(0, 1), b.slots, stream=b.stream)
    kg = kc.index_select(0, b.blocks).flatten(0, 1)  # [sum of pages * page_size, KVH, D]
    vg = vc.index_select(0, b.blocks).flatten(0, 1)
    _, heads, tokens, dim = query.shape
    groups = heads // kc.shape[2]
    out = query.new_empty((1, tokens, heads, dim))
    for q0, qn, kvn, t0, mask in b.seqs:
        q = query[:, :, q0:q0 + qn]
        k = kg[t0:t0 + kvn].transpose(0, 1).unsqueeze(0).contiguous()
        v = vg[t0:t0 + kvn].transpose(0, 1).unsqueeze(0).contiguous()
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
    its pages and how many of its prompt tokens came from the prefix cache (``cached``)."""
    __slots__ = ("rid", "prompt", "max_new", "out", "handle", "cached", "pages", "own", "kv_len", "logits",
                 "reserve")

    def __init__(self, rid, prompt, max_new):
        self.rid, self.prompt, self.max_new = rid, list(prompt), max_new
        self.out, self.logits = [], []
        self.handle, self.cached, self.pages, self.own, self.kv_len, self.reserve = None, 0, [], [], 0, 0


class KvhalEngine:
    """Serves requests on a transformers causal LM (or any module with the same forward convention) with its KV in
    kvhal: continuous batching, radix prefix reuse, optional chunked prefill, greedy decoding.

    The model's attention implementation must be ATTN_NAME (register() then set_attention(model, ATTN_NAME)); its
    forward must accept input_ids, position_ids, use_cache, logits_to_keep and pass kvhal_batch to attention.
    num_pages pages of page_size tokens are allocated once; at most max_batch requests run at a time; prefill_chunk
    (None: whole prompts) caps the prompt tokens a request computes per step; record_logits keeps each emitted
    token's logits row in Request.logits (on the CPU).
    """

    def __init__(self, model, num_pages=2048, page_size=16, max_batch=8, prefill_chunk=None, record_logits=False,
                 device=None, dtype=None):
        _positive("num_pages", num_pages)
        _positive("page_size", page_size)
        _positive("max_batch", max_batch)
        if prefill_chunk is not None:
            _positive("prefill_chunk", prefill_chunk)
        cfg = model.config
        self.model = model
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.dtype = dtype if dtype is not None else next(model.parameters()).dtype
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.cache = PagedKVCache(cfg.num_hidden_layers, num_pages, page_size, cfg.num_key_value_heads, head_dim,
                                  self.dtype, self.device)
        self.cm = kvhal.CacheManager(num_pages, page_size, "radix")
        self.P, self.max_batch, self.chunk, self.record = page_size, max_batch, prefill_chunk, record_logits
        self.waiting, self.running, self.done = [], [], []
        self.reserved = 0  # pages promised to running requests' future decode tokens
        self.stats = dict(requests=0, prompt_tokens=0, cached_tokens=0, prefill_computed=0, output_tokens=0,
                          steps=0, max_step_tokens=0, host_s=0.0)
        self._rid = 0

    def add(self, prompt, max_new_tokens):
        """Queues a request (prompt: a sequence of token ids) and returns its Request."""
        prompt = list(prompt)
        if not prompt:
            raise ValueError("prompt must hold at least one token")
        _positive("max_new_tokens", max_new_tokens)
        r = Request(self._rid, prompt, max_new_tokens)
        self._rid += 1
        self.waiting.append(r)
        return r

    def _pages_for(self, n):
        return -(-n // self.P)

    def _admit(self):
        while self.waiting and len(self.running) < self.max_batch:
            r = self.waiting[0]
            handle, cached, pages = self.cm.match(r.prompt[:-1])  # the last prompt token is always computed
            need = self._pages_for(len(r.prompt)) - len(pages)
            future = self._pages_for(len(r.prompt) + r.max_new - 1) - self._pages_for(len(r.prompt))
            if self.cm.available - self.reserved < need + future:
                self.cm.unlock(handle)
                if not self.running:
                    raise kvhal.OutOfMemory(f"request {r.rid} needs {need + future} pages, the pool cannot hold it")
                return
            own = list(self.cm.allocate(need))
            self.waiting.pop(0)
            r.handle, r.cached, r.pages, r.own, r.kv_len = handle, cached, list(pages) + own, own, cached
            r.reserve = future
            self.reserved += future
            self.running.append(r)
            self.stats["requests"] += 1
            self.stats["prompt_tokens"] += len(r.prompt)
            self.stats["cached_tokens"] += cached

    def _finish(self, r):
        kv_tokens = (r.prompt + r.out)[:r.kv_len]
        self.cm.cache_finished_suffix(r.handle, kv_tokens, r.own, start=r.cached)
        self.reserved -= r.reserve
        r.handle = None
        self.running.remove(r)
        self.done.append(r)

    def _schedule(self):
        """The step's tokens, positions, slots, block tables and per-request spans."""
        P = self.P
        ids, pos, slots, blocks, lidx, sched, seqs = [], [], [], [], [], [], []
        for r in self.running:
            if r.kv_len < len(r.prompt):  # prefill, maybe chunked
                n = len(r.prompt) - r.kv_len
                if self.chunk:
                    n = min(n, self.chunk)
                toks = r.prompt[r.kv_len:r.kv_len + n]
                emits = r.kv_len + n == len(r.prompt)
                self.stats["prefill_computed"] += n
            else:  # decode: feed the last generated token
                toks, emits = [r.out[-1]], True
            n, start, kv_after = len(toks), r.kv_len, r.kv_len + len(toks)
            while len(r.pages) < self._pages_for(kv_after):  # a decode crossing into a new (reserved) page
                page = self.cm.allocate(1)[0]
                r.pages.append(page)
                r.own.append(page)
                r.reserve -= 1
                self.reserved -= 1
            q0 = len(ids)
            ids += toks
            pos += range(start, kv_after)
            slots += [r.pages[p // P] * P + p % P for p in range(start, kv_after)]
            t0 = len(blocks) * P
            blocks += r.pages[:self._pages_for(kv_after)]
            seqs.append((q0, n, kv_after, t0))
            if emits:
                lidx.append(q0 + n - 1)
            sched.append((r, n, emits))
        return ids, pos, slots, blocks, lidx, sched, seqs

    @torch.no_grad()
    def step(self):
        """Admits what fits, runs one forward over every running request, emits tokens, finishes requests.
        Returns False when nothing was left to run."""
        t_host = time.perf_counter()
        self._admit()
        if not self.running:
            return False
        ids, pos, slots, blocks, lidx, sched, seqs = self._schedule()
        T = len(ids)
        buf = torch.tensor(ids + pos + slots + blocks + lidx, dtype=torch.int64).to(self.device, non_blocking=True)
        input_ids, position_ids = buf[:T].view(1, T), buf[T:2 * T].view(1, T)
        slot_t, block_t = buf[2 * T:3 * T], buf[3 * T:3 * T + len(blocks)]
        logits_idx = buf[3 * T + len(blocks):]
        full = []
        for q0, n, kvn, t0 in seqs:
            mask = None
            if 1 < n < kvn:  # a chunk after cached tokens: causal, aligned bottom-right
                qpos = torch.arange(kvn - n, kvn, device=self.device)
                mask = torch.arange(kvn, device=self.device)[None, :] <= qpos[:, None]
            full.append((q0, n, kvn, t0, mask))
        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        batch = KvhalBatch(self.cache, slot_t, block_t, full, stream)
        self.stats["host_s"] += time.perf_counter() - t_host
        out = self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False, kvhal_batch=batch,
                         logits_to_keep=logits_idx)
        logits = out.logits[0] if hasattr(out, "logits") else out[0]
        next_tokens = logits.argmax(-1).tolist()
        rows = logits.float().cpu() if self.record else None
        t_host = time.perf_counter()
        i = 0
        for r, n, emits in sched:
            r.kv_len += n
            if emits:
                r.out.append(next_tokens[i])
                if self.record:
                    r.logits.append(rows[i])
                i += 1
                self.stats["output_tokens"] += 1
                if len(r.out) >= r.max_new:
                    self._finish(r)
        self.stats["steps"] += 1
        self.stats["max_step_tokens"] = max(self.stats["max_step_tokens"], T)
        self.stats["host_s"] += time.perf_counter() - t_host
        return True

    def run(self):
        """Steps until every queued request has finished; returns the finished requests in finishing order."""
        while self.waiting or self.running:
            self.step()
        return self.done

    def hit_rate(self):
        """Share of admitted prompt tokens served from the prefix cache."""
        return self.stats["cached_tokens"] / max(1, self.stats["prompt_tokens"])


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
