"""The package with CUDA tensors from PyTorch (GPU machine only; skipped here): ops against torch indexing, DLPack
with the stream protocol, default and per-thread streams, torch streams, errors, out-of-range slots per stream."""
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import kvhal  # noqa: E402

DT = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("stream", ["none", "current", "side", "legacy", "per_thread"])
def test_paged_caching_cuda(dt, stream):
    kc = torch.zeros(32, 16, 8, 128, dtype=dt, device="cuda")
    vc = torch.zeros_like(kc)
    k = torch.randn(64, 8, 128, device="cuda").to(dt)
    v = torch.randn(64, 8, 128, device="cuda").to(dt)
    s = torch.randperm(32 * 16, device="cuda")[:64]
    s[5] = -1
    st = {"none": None, "current": torch.cuda.current_stream(), "side": torch.cuda.Stream(),
          "legacy": kvhal.STREAM_LEGACY, "per_thread": kvhal.STREAM_PER_THREAD}[stream]
    if isinstance(st, torch.cuda.Stream):
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            kvhal.paged_caching(kc, vc, k, v, s, stream=st)
        torch.cuda.current_stream().wait_stream(st)
    else:
        kvhal.paged_caching(kc, vc, k, v, s, stream=st)
    torch.cuda.synchronize()
    ek, ev = torch.zeros_like(kc).view(-1, 8, 128), torch.zeros_like(vc).view(-1, 8, 128)
    keep = s >= 0
    ek[s[keep]] = k[keep]
    ev[s[keep]] = v[keep]
    assert torch.equal(kc.view(-1, 8, 128), ek) and torch.equal(vc.view(-1, 8, 128), ev)


def test_out_of_range_slot_reported_on_the_stream():
    kc = torch.zeros(4, 16, 2, 64, device="cuda")
    k = torch.ones(2, 2, 64, device="cuda")
    st = torch.cuda.Stream()
    ks = kvhal.Stream("cuda:0", st)
    kvhal.paged_caching(kc, kc, k, k, torch.tensor([0, 64], device="cuda"), stream=ks)
    with pytest.raises(kvhal.DeviceFault):
        ks.check_errors()
    ks.check_errors()


def test_copy_blocks_and_tensor_copy_cuda():
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


def test_errors_cuda():
    kc = torch.zeros(4, 16, 2, 64, device="cuda")
    with pytest.raises(kvhal.DeviceMismatch):
        kvhal.paged_caching(kc, kc, torch.ones(1, 2, 64), torch.ones(1, 2, 64), torch.tensor([0]))
