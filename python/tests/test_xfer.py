"""kvhal.xfer: two agents in one process, over TCP on loopback and over shared memory, a request's pages sent
into the pages the receiver granted and checked value for value (and every other page unchanged); offers on the
CMA path; refusals naming the argument. Skipped, with the reason, where kvhal was built without libkvhal-xfer."""
import threading
import time

import numpy as np
import pytest

import kvhal

try:
    import kvhal.xfer as X
except ImportError as e:  # built without the transfer library
    pytest.skip(str(e), allow_module_level=True)

TOKEN = "kvhal-python-test"
LAYERS, HEADS, DIM, PS, BLOCKS = 3, 2, 4, 4, 16


def cache(seed):
    pc = kvhal.PagedCache(LAYERS, HEADS, DIM, PS, num_blocks=BLOCKS)
    rng = np.random.default_rng(seed)
    for layer in range(LAYERS):
        for view in pc.layer(layer):
            view.copy_from(rng.standard_normal(view.shape).astype(np.float32))
    return pc


def snapshot(pc):
    return [[np.from_dlpack(v).copy() for v in pc.layer(layer)] for layer in range(LAYERS)]


def pump(agents, want, seconds=10.0):
    """Progresses the agents until every kind in want was seen; the events by kind."""
    seen = {}
    until = time.monotonic() + seconds
    while not all(k in seen for k in want):
        assert time.monotonic() < until, f"no {[k for k in want if k not in seen]} within {seconds} s: {seen}"
        for a in agents:
            ev = a.progress(10)
            if ev is not None:
                seen.setdefault(ev.kind, []).append(ev)
    return seen


def connect(send, recv):
    """send connects to recv while another thread progresses recv until connect returned (connect waits for the
    answer, which recv sends from its progress)."""
    got, stop = [], threading.Event()
    address = recv.address  # before the thread enters recv (a second call on a busy agent is refused)

    def serve():
        while not stop.is_set():
            ev = recv.progress(10)
            if ev is not None:
                got.append(ev)

    t = threading.Thread(target=serve)
    t.start()
    try:
        peer = send.connect(address, TOKEN)
    finally:
        stop.set()
        t.join()
    assert [e.kind for e in got] == ["peer_connected"], [(e.kind, e.message) for e in got]
    assert got[0].peer is not None and got[0].peer.name == "prefill-py"
    assert peer.name == "decode-py"
    return peer, got[0].peer


@pytest.fixture(params=["tcp", "shm"])
def pair(request):
    recv = X.Agent(TOKEN, name="decode-py", timeout_ms=5000, transports=request.param)
    send = X.Agent(TOKEN, name="prefill-py", timeout_ms=5000, transports=request.param)
    rc, sc = cache(1), cache(2)
    recv.register_cache(rc)
    send.register_cache(sc)
    ps, pr = connect(send, recv)
    yield send, recv, sc, rc, ps, pr
    send.close()
    recv.close()


def test_grant_send_receive_verified(pair):
    send, recv, sc, rc, ps, pr = pair
    before = snapshot(rc)
    src = snapshot(sc)
    cm = kvhal.CacheManager(BLOCKS, PS)
    pages = cm.allocate(5)
    xr = pr.post_receive(42, pages, manager=cm)
    assert xr.is_receive and xr.request_id == 42
    grant = pump([send, recv], ["grant"])["grant"][0]
    assert grant.peer is ps and grant.request_id == 42 and list(grant.pages) == list(pages)
    src_pages = np.array([9, 0, 15, 3, 7], np.int32)
    xs = ps.send_pages(42, src_pages, grant.pages, first_layer=0, num_layers=1)  # layer by layer
    xs2 = ps.send_pages(42, src_pages, grant.pages, first_layer=1)
    seen = pump([send, recv], ["recv_done", "send_done"])
    done = seen["recv_done"][0]
    assert done.transfer is xr and done.status is None, done.message
    assert xs.wait(5000) is True and xs2.wait(5000) is True and xr.test() is True
    info = xr.info()
    assert info["bytes_done"] == info["bytes_total"] == 5 * LAYERS * 2 * PS * HEADS * DIM * 4 and info["is_receive"]
    after = snapshot(rc)
    for layer in range(LAYERS):
        for side in range(2):
            want = before[layer][side].copy()
            want[np.asarray(pages)] = src[layer][side][src_pages]
            np.testing.assert_array_equal(after[layer][side], want, err_msg=f"layer {layer} side {side}")
    cm.free(pages)
    cm.check_integrity()


def test_stream_layers_with_events(pair):
    """A stream into the granted pages: layers handed one by one (each with a device event recorded after its
    writes, or none), a 'layer_done' per layer on the receiver, then recv_done; every page checked."""
    send, recv, sc, rc, ps, pr = pair
    before, src = snapshot(rc), snapshot(sc)
    cm = kvhal.CacheManager(BLOCKS, PS)
    pages = cm.allocate(4)
    xr = pr.post_receive_layers(9, pages, manager=cm)
    grant = pump([send, recv], ["grant"])["grant"][0]
    src_pages = [2, 14, 6, 11]
    xs = ps.stream_open(9, src_pages, grant.pages)
    assert not xs.is_receive and xs.request_id == 9
    events = []
    for layer in (1, 0):  # any order; layer 2 not yet: the receive is not complete
        e = kvhal.Event("cpu:0")
        e.record()
        events.append(e)
        xs.stream_layer(layer, e)
    seen = pump([send, recv], ["layer_done"])
    assert xr.test() is False
    xs.stream_layer(2)  # without an event: it goes now
    seen2 = pump([send, recv], ["recv_done", "send_done"])
    done = sorted(e.num_pages for e in seen.get("layer_done", []) + seen2.get("layer_done", []))
    assert done == [0, 1, 2] and seen2["recv_done"][0].status is None
    after = snapshot(rc)
    for layer in range(LAYERS):
        for side in range(2):
            want = before[layer][side].copy()
            want[np.asarray(pages)] = src[layer][side][src_pages]
            np.testing.assert_array_equal(after[layer][side], want)
    with pytest.raises(kvhal.InvalidArgument, match="written"):
        ps.stream_open(10, [1], [1]).stream_layer(0, "not an event")
    with pytest.raises(kvhal.OutOfRange, match="layer"):
        ps.stream_open(11, [1], [1]).stream_layer(-1)
    with pytest.raises(kvhal.InvalidArgument, match="dst_pages"):
        ps.stream_open(12, [1, 2], [1])
    cm.free(pages)


def test_offer_on_one_host(pair):
    send, recv, sc, rc, ps, pr = pair
    if ps.ipc != "cma":
        pytest.skip(f"the receiver reads no pages from this process here ({ps.ipc!r}): offers need the CMA path")
    src = snapshot(sc)
    xs = ps.offer_pages(7, [1, 2])
    offer = pump([send, recv], ["offer"])["offer"][0]
    assert offer.request_id == 7 and offer.num_pages == 2
    xr = pr.post_receive(7, [10, 11])
    pump([send, recv], ["recv_done", "send_done"])
    assert xr.test() and xs.test() and xr.info()["path"] == "cma"
    np.testing.assert_array_equal(snapshot(rc)[2][1][[10, 11]], src[2][1][[1, 2]])


def test_cancel_gives_pages_back(pair):
    send, recv, sc, rc, ps, pr = pair
    cm = kvhal.CacheManager(BLOCKS, PS)
    pages = cm.allocate(3)
    xr = pr.post_receive(5, pages, manager=cm)
    xr.cancel()
    with pytest.raises(kvhal.Canceled):
        while not xr.wait(100):
            pass
    assert cm.num_free == BLOCKS  # the granted pages went back
    xr.release()
    with pytest.raises(kvhal.InvalidHandle, match="released"):
        xr.info()


def test_bad_arguments(pair):
    send, recv, sc, rc, ps, pr = pair
    with pytest.raises(TypeError):
        X.Agent()
    with pytest.raises(kvhal.InvalidArgument, match="token"):
        X.Agent(5)
    with pytest.raises(kvhal.InvalidArgument, match="token"):
        X.Agent("")
    with pytest.raises(kvhal.InvalidArgument, match="timeout_ms"):
        X.Agent(TOKEN, timeout_ms=-1)
    with pytest.raises(kvhal.InvalidArgument, match="transports"):
        X.Agent(TOKEN, transports=3)
    with pytest.raises(kvhal.BackendError):
        X.Agent(TOKEN, transports="no-such-transport")
    with pytest.raises(kvhal.InvalidArgument, match="cache"):
        send.register_cache("cache")
    with pytest.raises(kvhal.InvalidArgument, match="address"):
        send.connect(12, TOKEN)
    with pytest.raises(kvhal.InvalidArgument):
        send.connect(b"not an address", TOKEN)
    with pytest.raises(kvhal.InvalidArgument, match="request_id"):
        pr.post_receive(-1, [1])
    with pytest.raises(kvhal.OutOfRange, match="pages"):
        pr.post_receive(1, [BLOCKS])
    with pytest.raises(kvhal.InvalidArgument, match="pages"):
        pr.post_receive(1, [1.5])
    with pytest.raises(kvhal.InvalidArgument, match="manager"):
        pr.post_receive(1, [1], manager=3)
    with pytest.raises(kvhal.InvalidArgument, match="dst_pages"):
        ps.send_pages(1, [1, 2], [3])
    with pytest.raises(kvhal.InvalidArgument, match="timeout_ms"):
        send.progress(-5)
    with pytest.raises(TypeError):
        X.Peer()
    loner = X.Agent(TOKEN)
    with pytest.raises(kvhal.InvalidArgument):  # no cache registered
        loner.connect(recv.address, TOKEN)
    loner.close()
    with pytest.raises(kvhal.InvalidHandle, match="closed"):
        loner.progress()
    assert loner.closed


def test_close_invalidates_peers_and_transfers():
    recv = X.Agent(TOKEN, name="decode-py", timeout_ms=5000, transports="tcp")
    send = X.Agent(TOKEN, name="prefill-py", timeout_ms=5000, transports="tcp")
    recv.register_cache(cache(3))
    send.register_cache(cache(4))
    ps, pr = connect(send, recv)
    cm = kvhal.CacheManager(BLOCKS, PS)
    xr = pr.post_receive(1, cm.allocate(2), manager=cm)
    recv.close()  # fails the receive: its pages go back
    assert cm.num_free == BLOCKS
    with pytest.raises(kvhal.InvalidHandle):
        xr.test()
    with pytest.raises(kvhal.InvalidHandle):
        pr.post_receive(2, [1])
    send.close()


SENDER = r"""
import sys, numpy as np, kvhal, kvhal.xfer as X
from test_xfer import cache, TOKEN
tls, address = sys.argv[1], bytes.fromhex(sys.stdin.readline().strip())
with X.Agent(TOKEN, name="prefill-py", timeout_ms=5000, transports=tls) as a:
    a.register_cache(cache(2))
    peer = a.connect(address, TOKEN)
    grant = None
    while grant is None:
        ev = a.progress(100)
        if ev is not None and ev.kind == "grant":
            grant = ev
    xs = [peer.send_pages(grant.request_id, [4, 5, 6], grant.pages, first_layer=layer, num_layers=1)
          for layer in range(a.cache.num_layers)]
    assert all(x.wait(10000) for x in xs)
print("sent")
"""


@pytest.mark.parametrize("tls", ["tcp", "shm"])
def test_two_processes(tls):
    """A decode process (this one) receives a request's pages from a prefill process, layer by layer."""
    import os
    import subprocess
    import sys
    recv = X.Agent(TOKEN, name="decode-py", timeout_ms=5000, transports=tls)
    rc = cache(1)
    recv.register_cache(rc)
    before, src = snapshot(rc), snapshot(cache(2))
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen([sys.executable, "-c", SENDER, tls], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env, text=True)
    try:
        child.stdin.write(recv.address.hex() + "\n")
        child.stdin.flush()
        peer = pump([recv], ["peer_connected"], seconds=30)["peer_connected"][0].peer
        cm = kvhal.CacheManager(BLOCKS, PS)
        pages = cm.allocate(3)
        xr = peer.post_receive(11, pages, manager=cm)
        done = pump([recv], ["recv_done"], seconds=30)["recv_done"][0]
        assert done.transfer is xr and done.status is None, done.message
        out, err = child.communicate(timeout=30)
        assert child.returncode == 0 and out.strip() == "sent", err
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    after = snapshot(rc)
    for layer in range(LAYERS):
        for side in range(2):
            want = before[layer][side].copy()
            want[np.asarray(pages)] = src[layer][side][[4, 5, 6]]
            np.testing.assert_array_equal(after[layer][side], want)
    recv.close()
