"""The package with CUDA tensors from PyTorch (GPU machine; skipped without CUDA): ops against torch indexing for
every dtype and every way of naming a stream, DLPack in and out with the stream protocol, out-of-range slots per
stream, copy_blocks, tensor_copy, a torch.cuda.graph capture replayed with new slots, errors. Runs under pytest or
alone (`python3 test_gpu_torch.py`) where pytest is not installed."""
import contextlib
import sys

import torch

import kvhal

HAVE_CUDA = torch.cuda.is_available()
if __name__ != "__main__":
    import pytest

    if not HAVE_CUDA:
        pytest.skip("no CUDA device", allow_module_level=True)


@contextlib.contextmanager
def raises(cls):
    try:
        yield
    except cls:
        return
    raise AssertionError(f"{cls.__name__} was not raised")


def expect_paged(kc, vc, k, v, s):
    heads, dim = kc.shape[2], kc.shape[3]
    ek, ev = torch.zeros_like(kc).view(-1, heads, dim), torch.zeros_like(vc).view(-1, heads, dim)
    keep = s >= 0
    ek[s[keep]] = k[keep]
    ev[s[keep]] = v[keep]
    assert torch.equal(kc.view(-1, heads, dim), ek) and torch.equal(vc.view(-1, heads, dim), ev)


def test_paged_caching_cuda_every_dtype_and_stream():
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        for name in ("none", "current", "side", "kvhal", "legacy", "per_thread", "int"):
            kc = torch.zeros(32, 16, 8, 128, dtype=dt, device="cuda")
            vc = torch.zeros_like(kc)
            k = torch.randn(64, 8, 128, device="cuda").to(dt)
            v = torch.randn(64, 8, 128, device="cuda").to(dt)
            s = torch.randperm(32 * 16, device="cuda")[:64]
            s[5] = -1
            side = torch.cuda.Stream()
            st = {"none": None, "current": torch.cuda.current_stream(), "side": side,
                  "kvhal": kvhal.Stream("cuda:0", side), "legacy": kvhal.STREAM_LEGACY,
                  "per_thread": kvhal.STREAM_PER_THREAD, "int": side.cuda_stream}[name]
            side.wait_stream(torch.cuda.current_stream())
            kvhal.paged_caching(kc, vc, k, v, s, stream=st)
            torch.cuda.synchronize()
            expect_paged(kc, vc, k, v, s)


def test_strided_views_and_hnd_cache_cuda():
    store = torch.zeros(16, 8, 16, 64, device="cuda", dtype=torch.float16)  # HND storage
    kc = store.permute(0, 2, 1, 3)
    vc = torch.zeros(16, 16, 8, 64, device="cuda", dtype=torch.float16)
    big = torch.randn(40, 8, 128, device="cuda").half()
    k, v = big[3:35, :, ::2], big[4:36, :, 1::2]
    s = torch.randperm(256, device="cuda")[:32]
    kvhal.paged_caching(kc, vc, k, v, s, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    expect_paged(kc.contiguous(), vc, k, v, s)


def test_out_of_range_slot_reported_on_the_stream():
    kc = torch.zeros(4, 16, 2, 64, device="cuda")
    k = torch.ones(2, 2, 64, device="cuda")
    ks = kvhal.Stream("cuda:0", torch.cuda.Stream())
    kvhal.paged_caching(kc, kc, k, k, torch.tensor([0, 64], device="cuda"), stream=ks)
    with raises(kvhal.DeviceFault):
        ks.check_errors()
    ks.check_errors()


def test_copy_blocks_tensor_copy_and_dlpack_out_cuda():
    caches = [torch.randn(8, 16, 2, 64, device="cuda") for _ in range(2)]
    ref = [c.clone() for c in caches]
    kvhal.copy_blocks(caches, [(0, 5), (1, 6)])
    torch.cuda.synchronize()
    for c, r in zip(caches, ref):
        r[5], r[6] = r[0].clone(), r[1].clone()
        assert torch.equal(c, r)
    a = torch.randn(5, 7, device="cuda")
    b = torch.empty(7, 5, device="cuda").t()
    kvhal.tensor_copy(b, a)
    torch.cuda.synchronize()
    assert torch.equal(a, b)
    t = kvhal.empty((3, 4), "f32", "cuda:0")
    tt = torch.from_dlpack(t)  # kvhal -> torch on the GPU, zero copies
    assert tt.device.type == "cuda" and tt.shape == (3, 4)
    tt.fill_(2.0)
    back = torch.empty(3, 4, device="cuda")
    kvhal.tensor_copy(back, t)
    torch.cuda.synchronize()
    assert torch.equal(back, tt)


def test_graph_capture_replays_with_new_slots():
    kc = torch.zeros(64, 16, 8, 128, dtype=torch.float16, device="cuda")
    vc = torch.zeros_like(kc)
    k = torch.zeros(32, 8, 128, dtype=torch.float16, device="cuda")
    v = torch.zeros_like(k)
    s = torch.zeros(32, dtype=torch.int64, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        kvhal.paged_caching(kc, vc, k, v, s, stream=torch.cuda.current_stream())
    ek = torch.zeros_like(kc).view(-1, 8, 128)
    for rep in range(10):
        ns = torch.randperm(64 * 16, device="cuda")[:32]
        s.copy_(ns)
        k.copy_(torch.randn_like(k))
        v.copy_(torch.randn_like(v))
        g.replay()
        torch.cuda.synchronize()
        ek[ns] = k
        assert torch.equal(kc.view(-1, 8, 128), ek), f"replay {rep}"


def test_copy_blocks_inside_a_capture():
    """copy_blocks is recorded where its cache table and pairs travel in the kernel parameters (up to 138 caches):
    a replay copies what the blocks hold then. With more caches the pairs are staged through host memory: refused
    on the capturing stream (kvhal.Unsupported), and the capture stays valid."""
    caches = [torch.randn(8, 16, 2, 64, device="cuda") for _ in range(2)]
    kvhal.copy_blocks(caches, [(0, 1)])  # outside: fine
    many = [torch.zeros(8, 16, 2, 64, device="cuda") for _ in range(140)]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        kvhal.copy_blocks(caches, [(2, 3), (4, 6)], stream=torch.cuda.current_stream())
        with raises(kvhal.Unsupported):
            kvhal.copy_blocks(many, [(0, 1)], stream=torch.cuda.current_stream())
    for _ in range(3):
        for c in caches:
            c.copy_(torch.randn_like(c))
        before = [c.clone() for c in caches]
        g.replay()
        torch.cuda.synchronize()
        for c, b in zip(caches, before):
            b[3] = b[2]
            b[6] = b[4]
            assert torch.equal(c, b)


def test_errors_cuda():
    kc = torch.zeros(4, 16, 2, 64, device="cuda")
    with raises(kvhal.DeviceMismatch):
        kvhal.paged_caching(kc, kc, torch.ones(1, 2, 64), torch.ones(1, 2, 64), torch.tensor([0]))


def test_exchange_api_path_and_stream_order():
    """PyTorch builds that offer the DLPack C exchange API (torch.Tensor.__dlpack_c_exchange_api__): kvhal imports
    through it (no __dlpack__ call) whatever the call's stream, ordering torch's current stream before another one
    with an event; with no stream the call runs on torch's current stream. On builds without the API every argument
    goes through __dlpack__ (stream=-1, the same ordering by kvhal). The results are right either way."""
    has = hasattr(torch.Tensor, "__dlpack_c_exchange_api__") or hasattr(torch.Tensor, "__c_dlpack_exchange_api__")
    path = kvhal.dlpack_path(torch.zeros(1, device="cuda"))
    print(f"torch {torch.__version__}: exchange API {'offered' if has else 'absent'}, kvhal path {path}")
    assert path == ("c_exchange_api" if has else "__dlpack__")
    calls = []
    original = torch.Tensor.__dlpack__

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    torch.Tensor.__dlpack__ = counting  # a type change: kvhal looks the API up again, still finds it
    try:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            made = []
            for _ in range(3):
                kc = torch.zeros(32, 16, 8, 128, dtype=torch.bfloat16, device="cuda")
                vc = torch.zeros_like(kc)
                k = torch.randn(64, 8, 128, device="cuda").to(torch.bfloat16)
                v = torch.randn(64, 8, 128, device="cuda").to(torch.bfloat16)
                s = torch.randperm(32 * 16, device="cuda")[:64]
                made.append((kc, vc, k, v, s))
            kvhal.paged_caching(*made[0], stream=torch.cuda.current_stream())  # torch's current stream: side
            on_current = len(calls)
            kvhal.paged_caching(*made[1], stream=torch.cuda.default_stream())  # another stream than torch's
            on_other = len(calls) - on_current
            kvhal.paged_caching(*made[2])  # no stream: torch's current stream (side)
            on_none = len(calls) - on_current - on_other
        torch.cuda.synchronize()
    finally:
        torch.Tensor.__dlpack__ = original
    for args in made:
        expect_paged(*args)
    assert (on_current, on_other, on_none) == ((0, 0, 0) if has else (5, 5, 5))


def test_no_stream_is_torch_current_stream():
    """With no stream given, a torch user's read right after the call on torch's current (side) stream sees the
    write: the call ran on that stream (a stale read would show zeros)."""
    side = torch.cuda.Stream()
    for rep in range(20):
        with torch.cuda.stream(side):
            kc = torch.zeros(256, 16, 8, 128, dtype=torch.float16, device="cuda")
            vc = torch.zeros_like(kc)
            k = torch.randn(4096, 8, 128, device="cuda").to(torch.float16)
            s = torch.randperm(256 * 16, device="cuda")[:4096]
            kvhal.paged_caching(kc, vc, k, k, s)
            seen = kc.reshape(-1, 8, 128)[s].clone()  # queued on side right after the call
        side.synchronize()
        assert torch.equal(seen, k), rep


def test_every_stream_form_on_the_non_current_device():
    """torch's current device cuda:0, the tensors on cuda:1: every stream form works (no raw BufferError), ordered
    after torch's work on cuda:1. Needs two GPUs: skipped with one."""
    if torch.cuda.device_count() < 2:
        if __name__ != "__main__":
            pytest.skip("needs two GPUs")
        print("skip test_every_stream_form_on_the_non_current_device: needs two GPUs")
        return
    torch.cuda.set_device(0)
    dev = torch.device("cuda:1")
    side = torch.cuda.Stream(device=dev)
    forms = [None, side, side.cuda_stream, kvhal.Stream("cuda:1", side), kvhal.STREAM_PER_THREAD,
             kvhal.STREAM_LEGACY, torch.cuda.default_stream(dev)]
    for form in forms:
        kc = torch.zeros(32, 16, 8, 128, dtype=torch.bfloat16, device=dev)
        vc = torch.zeros_like(kc)
        k = torch.randn(64, 8, 128, device=dev).to(torch.bfloat16)
        v = torch.randn(64, 8, 128, device=dev).to(torch.bfloat16)
        s = torch.randperm(32 * 16, device=dev)[:64]
        kvhal.paged_caching(kc, vc, k, v, s, stream=form)
        kvhal.tensor_copy(vc[:1], kc[:1], stream=form)
        kvhal.copy_blocks([kc, vc], [(0, 1)], stream=form)
        torch.cuda.synchronize(dev)
        kvhal.synchronize("cuda:1")
        assert torch.cuda.current_device() == 0


if __name__ == "__main__":
    if not HAVE_CUDA:
        print("test_gpu_torch: no CUDA device")
        sys.exit(1)
    failed = 0
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print("ok  ", name)
            except Exception as e:  # noqa: BLE001 — report every test, then fail
                failed += 1
                print("FAIL", name, type(e).__name__, e)
    sys.exit(1 if failed else 0)
