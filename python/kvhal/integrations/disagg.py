"""Prefill and decode of a transformers model in two processes, the prompt's KV handed over by libkvhal-xfer layer
by layer while the prefill runs (kvhal.integrations.transformers engines on both sides).

- DecodeEngine (the process that serves): a KvhalEngine whose requests are prefilled elsewhere. At admission it
  allocates the prompt's pages, has its receiver thread (the only user of its agent, progressing it while decode
  steps run) post a receive into them (Peer.post_receive_layers: the grant goes to the prefill side, a 'layer_done'
  event comes as each layer lands) and
  asks the prefill process, over a control connection, for the prompt; once the pages arrived and the first token
  came back, the request decodes here like any other.
- PrefillServer (the other process): a KvhalEngine of batch 1 that computes each prompt and its first token. Right
  after a layer's K/V writes are enqueued it records a kvhal.Event on the step's stream and hands the layer to a
  stream into the granted pages (Peer.stream_open, Transfer.stream_layer); the agent sends the layer once the event
  has completed, so the transfer of layer i overlaps the compute of the layers after it. A sender thread is the
  only user of that side's agent. It answers with the first token and the request's timings:
  the prefill's compute time and the transfer time left exposed after it.

The control connection is any object with send / recv / poll (multiprocessing.connection): messages
("prefill", rid, prompt), ("first", rid, token, timings), ("error", rid, text) and ("stop",).
Both caches are made shareable (kvhal.PagedCache(shareable=True)) so that processes of one host can use GPU IPC.
"""
import queue
import threading
import time

import torch

import kvhal
from kvhal import xfer as _xfer

from .transformers import KvhalEngine
from .transformers import kvhal_device as kt_device

__all__ = ["DecodeEngine", "PrefillServer"]


def _drain(q):
    """Everything queued on q now: (items, whether the None that asks to stop was among them)."""
    items, stop = [], False
    while True:
        try:
            item = q.get_nowait()
        except queue.Empty:
            return items, stop
        if item is None:
            stop = True
        else:
            items.append(item)


class _LayerSender(threading.Thread):
    """The prefill side's agent, used by this thread alone: a stream per request into the pages the decode side
    granted (kvhal.xfer's Peer.stream_open), each layer handed with the event recorded after its writes (the agent
    sends it once the event completed), completions counted."""

    def __init__(self, agent, peer):
        super().__init__(name="kvhal-layer-sender", daemon=True)
        self.agent, self.peer = agent, peer
        self.items = queue.SimpleQueue()  # (rid, layer, kvhal.Event or None, src pages) or None to stop
        self.done, self.errors = {}, {}
        self.cv = threading.Condition()
        self.failure = None

    def run(self):
        grants, sources, layers, streams, stop = {}, {}, {}, {}, False
        try:
            while not stop or streams or layers:
                items, asked = _drain(self.items)
                stop = stop or asked
                for rid, layer, event, src in items:
                    sources.setdefault(rid, src)
                    layers.setdefault(rid, []).append((layer, event))
                ev = self.agent.progress(1 if (streams or layers) else 5)
                while ev is not None:
                    if ev.kind == "grant":
                        grants[ev.request_id] = ev.pages
                    elif ev.kind == "send_done" and ev.request_id in streams:
                        del streams[ev.request_id]
                        self._finished(ev.request_id, None if ev.status is None else f"{ev.status}: {ev.message}")
                    elif ev.kind == "peer_failed":
                        raise kvhal.PeerFailed(f"the decode side failed: {ev.message}")
                    ev = self.agent.progress(0)
                for rid in list(layers):
                    if rid not in streams:
                        if rid not in grants:
                            continue
                        streams[rid] = self.peer.stream_open(rid, sources.pop(rid), grants.pop(rid))
                    for layer, event in layers.pop(rid):
                        streams[rid].stream_layer(layer, event)
        except BaseException as e:  # noqa: BLE001 - reported to the waiting thread
            with self.cv:
                self.failure = e
                self.cv.notify_all()

    def _finished(self, rid, error):
        with self.cv:
            self.done[rid] = time.perf_counter()
            if error is not None:
                self.errors[rid] = error
            self.cv.notify_all()

    def wait_request(self, rid, timeout):
        """Blocks until every layer of rid was acknowledged; returns when that happened."""
        with self.cv:
            ok = self.cv.wait_for(lambda: self.failure is not None or rid in self.done, timeout)
            if self.failure is not None:
                raise self.failure
            if not ok:
                raise kvhal.Timeout(f"request {rid}: its layers were not all acknowledged within {timeout} s")
            if rid in self.errors:
                raise kvhal.PeerFailed(f"request {rid}: its stream failed ({self.errors.pop(rid)})")
            return self.done.pop(rid)


class _LayerReceiver(threading.Thread):
    """The decode side's agent once the prefill process connected, used by this thread alone: it posts the
    receives the engine asks for and progresses the agent without pause, so that layers land while the engine's
    thread computes decode steps (the receiver side drives the copies of the IPC path). The pages are posted
    without the cache manager (the engine's thread owns it): on a failure the engine raises and its pages go with
    it."""

    def __init__(self, agent, peer):
        super().__init__(name="kvhal-layer-receiver", daemon=True)
        self.agent, self.peer = agent, peer
        self.posts = queue.SimpleQueue()  # (rid, pages) or None to stop
        self.lock = threading.Lock()
        self.arrived, self.failed = [], {}  # rids whose K/V landed; rid -> reason
        self.layers = 0
        self.failure = None
        self.transfers = {}

    def run(self):
        try:
            stop = False
            while not stop or self.transfers:
                posts, asked = _drain(self.posts)
                stop = stop or asked
                for rid, pages in posts:
                    self.transfers[rid] = self.peer.post_receive_layers(rid, pages)
                ev = self.agent.progress(1)
                while ev is not None:
                    if ev.kind == "recv_done" and ev.request_id in self.transfers:
                        del self.transfers[ev.request_id]
                        with self.lock:
                            if ev.status is not None:
                                self.failed[ev.request_id] = f"{ev.status}: {ev.message}"
                            else:
                                self.arrived.append(ev.request_id)
                    elif ev.kind == "layer_done":
                        self.layers += 1
                    elif ev.kind == "peer_failed":
                        raise kvhal.PeerFailed(f"the prefill process failed: {ev.message}")
                    ev = self.agent.progress(0)
        except BaseException as e:  # noqa: BLE001 - reported to the engine's thread
            with self.lock:
                self.failure = e

    def take(self):
        """(rids whose K/V arrived since the last call, {rid: reason} of failed ones); raises the thread's failure."""
        with self.lock:
            if self.failure is not None:
                raise self.failure
            arrived, failed = self.arrived, self.failed
            self.arrived, self.failed = [], {}
            return arrived, failed


class PrefillServer:
    """Computes prompts for a DecodeEngine in another process and streams their K/V to it layer by layer.

    model: the same transformers model (same weights) as the decode side, its attention set to ATTN_NAME;
    token: the transfer agents' shared secret; decode_address: the DecodeEngine's agent address (bytes);
    engine keyword arguments (num_pages, page_size, ...) as KvhalEngine's (batch 1, whole prompts; with
    record_logits=True each first token's logits row goes back with it, for a DecodeEngine that records them too).
    """

    def __init__(self, model, token, decode_address, name="prefill", transports=None, timeout_ms=30000,
                 send_timeout_s=60.0, **engine_kw):
        engine_kw.update(max_batch=1, prefill_chunk=None, max_step_tokens=None, shareable=True)
        self.engine = KvhalEngine(model, **engine_kw)
        self.agent = _xfer.Agent(token, name=name, timeout_ms=timeout_ms, transports=transports)
        self.agent.register_cache(self.engine.cache.pc)
        self.peer = self.agent.connect(decode_address, token)  # the decode side progresses its agent meanwhile
        self.send_timeout_s = send_timeout_s
        self.sender = _LayerSender(self.agent, self.peer)
        self.sender.start()
        self.engine.on_layer = self._layer_written
        self._rid, self._src = None, None

    def _layer_written(self, layer):
        event = None
        if self.engine.stream is not None:  # the layer's writes are in once this point of torch's stream is reached
            event = kvhal.Event(kt_device(self.engine.device))
            event.record(self.engine.stream)
        self.sender.items.put((self._rid, layer, event, self._src))

    def prefill(self, rid, prompt):
        """One prompt: (first token, timings dict: compute_s, exposed_s; logits, the first token's logits row, when
        the engine records logits)."""
        eng = self.engine
        r = eng.add(prompt, 1)
        eng._admit()  # the pages it will write: sent as each layer is written
        if r not in eng.running:
            raise kvhal.OutOfMemory(f"request {rid}: the prefill side's pool cannot hold {len(prompt)} tokens")
        self._rid, self._src = rid, list(r.pages[:eng._pages_for(len(r.prompt))])
        t0 = time.perf_counter()
        eng.step()  # the forward; its layers go out while it runs; waits for the logits with the GIL released
        t1 = time.perf_counter()
        t2 = self.sender.wait_request(rid, self.send_timeout_s)
        # the pages were read by the sends: from here on the prefix cache may evict and reuse them. Exposed: how long
        # the last acknowledgement came after the compute (0 when it came before: everything hid behind it)
        timings = dict(compute_s=t1 - t0, exposed_s=max(0.0, t2 - t1), prompt=len(prompt), cached=r.cached)
        if eng.record:  # the first token's logits row goes back with it (record_logits=True on both sides)
            timings["logits"] = r.logits[0].numpy()  # by value: a pickled tensor would travel as shared memory
        return r.out[0], timings

    def serve(self, conn):
        """Answers the decode side's messages until ("stop",)."""
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                break
            _, rid, prompt = msg
            try:
                token, timings = self.prefill(rid, prompt)
            except kvhal.Error as e:
                conn.send(("error", rid, f"{type(e).__name__}: {e}"))
                continue
            conn.send(("first", rid, token, timings))

    def close(self):
        self.sender.items.put(None)
        self.sender.join(10)
        self.agent.close()


class DecodeEngine(KvhalEngine):
    """A KvhalEngine whose prompts a PrefillServer in another process computes (see the module's text).

    token: the agents' shared secret; conn: the control connection to the prefill process (or set ``conn`` before
    the first step); the other keyword arguments as KvhalEngine's. Give ``address`` to the prefill process, then
    call wait_peer(). Request.t_first holds, once a request decodes here, its timings: the prefill's compute_s,
    the transfer time exposed after it (exposed_s) and the time to first token seen here (ttft_s).
    """

    def __init__(self, model, token, conn=None, name="decode", transports=None, timeout_ms=30000, **kw):
        kw["shareable"] = True
        super().__init__(model, **kw)
        self.conn = conn
        self.agent = _xfer.Agent(token, name=name, timeout_ms=timeout_ms, transports=transports)
        self.agent.register_cache(self.cache.pc)
        self.peer, self.receiver = None, None
        self.remote = {}  # rid -> Request whose KV or first token has not arrived yet
        self.timings = []

    @property
    def address(self):
        return self.agent.address

    def wait_peer(self, timeout_s=60.0):
        """Progresses the agent until the prefill process connected."""
        until = time.monotonic() + timeout_s
        while self.peer is None:
            if time.monotonic() > until:
                raise kvhal.Timeout(f"no prefill process connected within {timeout_s} s")
            ev = self.agent.progress(10)
            if ev is not None and ev.kind == "peer_connected":
                self.peer = ev.peer
        if self.receiver is None:  # from here on the receiver thread alone uses the agent
            self.receiver = _LayerReceiver(self.agent, self.peer)
            self.receiver.start()
        return self.peer

    def _admit(self):
        if self.peer is None:
            raise kvhal.InvalidArgument("DecodeEngine: call wait_peer() before stepping")
        while self.waiting and len(self.running) + len(self.remote) < self.max_batch:
            r = self.waiting[0]
            need = self._pages_for(len(r.prompt))
            future = self._pages_for(len(r.prompt) + r.max_new - 1) - need
            if self.cm.available - self.reserved < need + future:
                if not self.running and not self.remote:
                    raise kvhal.OutOfMemory(f"request {r.rid} needs {need + future} pages, the pool cannot hold it")
                return
            t = time.perf_counter()
            r.handle = self.cm.match([])[0]  # every prompt page is received; finishing caches them here too
            r.pages = list(self.cm.allocate(need))
            self.stats["cm_s"] += time.perf_counter() - t
            r.own, r.cached, r.reserve = list(r.pages), 0, future
            r.t_first = dict(t0=time.perf_counter(), kv=False, timings=None)  # until the request decodes here
            self.reserved += future
            self.waiting.pop(0)
            self.receiver.posts.put((r.rid, list(r.pages)))
            self.conn.send(("prefill", r.rid, r.prompt))
            self.remote[r.rid] = r
            self.stats["requests"] += 1
            self.stats["prompt_tokens"] += len(r.prompt)

    def _pump(self, timeout_ms):
        arrived, failed = self.receiver.take()
        for rid, reason in failed.items():
            raise kvhal.PeerFailed(f"request {rid}: its K/V did not arrive ({reason})")
        for rid in arrived:
            r = self.remote.get(rid)
            if r is not None:
                r.t_first["kv"] = True
        self.stats["layers_received"] = self.receiver.layers
        if timeout_ms and not arrived:
            self.conn.poll(timeout_ms / 1000)
        while self.conn.poll():
            msg = self.conn.recv()
            r = self.remote.get(msg[1])
            if r is None:
                continue
            if msg[0] == "error":
                raise kvhal.PeerFailed(f"request {r.rid}: the prefill process refused it ({msg[2]})")
            r.out.append(msg[2])
            logits = msg[3].pop("logits", None)
            if self.record:
                if logits is None:  # r.logits would fall a row behind r.out: every later row on the wrong token
                    raise kvhal.InvalidArgument(f"request {r.rid}: record_logits=True needs the PrefillServer to "
                                                "record logits too (PrefillServer(..., record_logits=True))")
                r.logits.append(torch.from_numpy(logits))
            r.t_first["timings"] = msg[3]
        for rid, r in list(self.remote.items()):
            if r.t_first["kv"] and r.t_first["timings"] is not None:  # K/V here and first token back
                del self.remote[rid]
                timings = dict(r.t_first["timings"], ttft_s=time.perf_counter() - r.t_first["t0"])
                self.timings.append(timings)
                r.t_first = timings
                r.kv_len = len(r.prompt)
                self.stats["output_tokens"] += 1
                self.running.append(r)
                if len(r.out) >= r.max_new:
                    self._finish(r)

    def step(self):
        self._admit()
        self._pump(0 if self.running else 1)
        if not self.running:
            return bool(self.remote or self.waiting)
        return self._forward_step(time.perf_counter())

    def run(self):
        while self.waiting or self.running or self.remote:
            self.step()
        return self.done

    def close(self):
        """Stops the prefill process's server loop and closes the agent."""
        self.conn.send(("stop",))
        if self.receiver is not None:
            self.receiver.posts.put(None)
            self.receiver.join(30)
        self.agent.close()
