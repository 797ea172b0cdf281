"""kvhal.compat: vLLM's reshape_and_cache_flash and FlashInfer's append_paged_kv_cache against references written
in torch from the peers' documented semantics, bit for bit, on every present device (CPU and CUDA with torch
tensors, others with kvhal.Tensor copies); the fp8 path of uint8 caches on all 256 codes of each format and on all
65536 f16 inputs; the bad arguments."""
import numpy as np
import pytest

import kvhal
from kvhal.compat import flashinfer, vllm

torch = pytest.importorskip("torch")

# (exponent bits, mantissa bits, bias, largest finite, fnuz) of each fp8 format, from their definitions
FP8 = {"fp8_e4m3": (4, 3, 7, 448.0, False), "fp8_e5m2": (5, 2, 15, 57344.0, False),
       "fp8_e4m3fnuz": (4, 3, 8, 240.0, True), "fp8_e5m2fnuz": (5, 2, 16, 57344.0, True)}
VLLM_FP8 = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
KV_NAME = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.int64: "i64",
           torch.int32: "i32"}


def torch_fp8_encode(x, fmt):
    """vLLM's conversion (round to nearest even, saturated to the largest finite magnitude, NaN to NaN) in torch:
    uint8 codes of the float32 tensor x."""
    e_bits, m_bits, bias, fmax, fnuz = FP8[fmt]
    x = x.to(torch.float32)
    neg = torch.signbit(x)
    nan = torch.isnan(x)
    a = torch.where(nan, torch.zeros_like(x), x.abs().clamp(max=fmax))
    emin = 1 - bias
    one = torch.ones_like(a)
    q_exp = torch.clamp(torch.frexp(a).exponent - 1, min=emin) - m_bits
    v = torch.round(a / torch.ldexp(one, q_exp)) * torch.ldexp(one, q_exp)  # exact: powers of two; round: RNE
    exp = torch.frexp(v).exponent - 1
    sub = (v == 0) | (exp < emin)
    code_sub = (v / 2.0 ** (emin - m_bits)).to(torch.int32)
    code_norm = ((exp + bias) << m_bits) | ((v / torch.ldexp(one, exp - m_bits)).to(torch.int32) - (1 << m_bits))
    code = torch.where(sub, code_sub, code_norm)
    sign = (neg & (code != 0)) if fnuz else neg
    code = code | (sign.to(torch.int32) << 7)
    nan_code = torch.full_like(code, 0x80) if fnuz else 0x7F | (neg.to(torch.int32) << 7)
    return torch.where(nan, nan_code, code).to(torch.uint8)


def torch_fp8_decode(codes, fmt):
    """The float32 value of each uint8 code (NaN and the infinities included), from the format's definition."""
    e_bits, m_bits, bias, _, fnuz = FP8[fmt]
    c = codes.to(torch.int64)
    e = (c >> m_bits) & ((1 << e_bits) - 1)
    m = (c & ((1 << m_bits) - 1)).to(torch.float64)
    val = torch.where(e == 0, m * 2.0 ** (1 - bias - m_bits), (m + 2 ** m_bits) * torch.pow(2.0, (e - bias - m_bits).double()))
    val = torch.where((c >> 7) == 1, -val, val)
    if fnuz:
        val = torch.where(c == 0x80, torch.full_like(val, float("nan")), val)
    elif e_bits == 4:
        val = torch.where((c & 0x7F) == 0x7F, torch.full_like(val, float("nan")), val)
    else:
        top = e == (1 << e_bits) - 1
        val = torch.where(top & (m == 0), torch.where((c >> 7) == 1, -torch.inf, torch.inf), val)
        val = torch.where(top & (m != 0), torch.full_like(val, float("nan")), val)
    return val.to(torch.float32)


def ref_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """vLLM's reshape_and_cache_flash in torch: token t < len(slot_mapping) goes to block slot // block_size, offset
    slot % block_size (flash layout [blocks, block_size, heads, head_size]); negative slots are skipped."""
    block_size = key_cache.shape[1]
    for t in range(slot_mapping.shape[0]):
        s = int(slot_mapping[t])
        if s < 0:
            continue
        for src, dst, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
            if kv_cache_dtype == "auto":
                dst[s // block_size, s % block_size] = src[t]
            else:
                dst[s // block_size, s % block_size] = torch_fp8_encode(src[t].float() / float(scale),
                                                                        VLLM_FP8[kv_cache_dtype])


def torch_device(device):
    """The torch device of a kvhal device where torch has it (cpu; cuda with a CUDA torch), else None."""
    if device.startswith("cpu"):
        return "cpu"
    if device.startswith("cuda") and torch.cuda.is_available():
        return device
    return None


def to_device(x, device, kdtype=None):
    """x (a CPU torch tensor) as a torch tensor on device where torch has it, else a kvhal.Tensor copy of it."""
    if torch_device(device):
        return x.to(torch_device(device))
    t = kvhal.empty(tuple(x.shape), kdtype or KV_NAME[x.dtype], device)
    t.copy_from(x.contiguous())
    return t


def to_host(y, like):
    if isinstance(y, torch.Tensor):
        if y.is_cuda:
            torch.cuda.synchronize(y.device)
        return y.cpu()
    out = torch.empty_like(like)
    y.copy_to(out)
    return out


def bits(t):
    """Integer bits of a tensor, for bit-exact comparisons (NaN payloads included)."""
    return t.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


# ---- vLLM ----
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_vllm_reshape_and_cache_flash(device, kv_cache_dtype, dtype):
    g = torch.Generator().manual_seed(7)
    nb, bs, h, d, n = 6, 4, 2, 8, 9
    key = (torch.randn(n + 3, h, d, generator=g) * 40).to(dtype)  # 3 rows of padding past the slots
    value = (torch.randn(n + 3, h, d, generator=g) * 40).to(dtype)
    slots = torch.randperm(nb * bs, generator=g)[:n].to(torch.int64)
    slots[2] = -1  # padding
    fp8 = kv_cache_dtype != "auto"
    cdt = torch.uint8 if fp8 else dtype
    kc = torch.randint(0, 255, (nb, bs, h, d), generator=g).to(cdt) if fp8 else torch.randn(nb, bs, h, d, generator=g).to(cdt)
    vc = kc.clone() + 1 if fp8 else kc.clone() * 2
    k_scale, v_scale = torch.tensor([0.37]), torch.tensor([1.5])
    rk, rv = kc.clone(), vc.clone()
    ref_reshape_and_cache_flash(key, value, rk, rv, slots, kv_cache_dtype, k_scale, v_scale)
    cache_kd = VLLM_FP8.get(kv_cache_dtype)
    dk, dv = to_device(kc, device, cache_kd), to_device(vc, device, cache_kd)
    vllm.reshape_and_cache_flash(to_device(key, device), to_device(value, device), dk, dv, to_device(slots, device),
                                 kv_cache_dtype, k_scale, v_scale)
    assert torch.equal(bits(to_host(dk, kc)), bits(rk))
    assert torch.equal(bits(to_host(dv, vc)), bits(rv))


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz", "fp8_e5m2fnuz"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fp8_uint8_all_codes(device, fmt, dtype):
    """Every one of the 256 codes, decoded and written back through a uint8 (CPU) or fp8 (device) cache, gives the
    reference's code: itself for every finite code, the canonical NaN for NaNs, the largest finite for infinities."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    vals = torch_fp8_decode(codes, fmt)
    want = torch_fp8_encode(vals, fmt)
    finite = torch.isfinite(vals)
    if not FP8[fmt][4]:
        assert torch.equal(want[finite], codes[finite])  # the reference itself round-trips every finite code
    for scale in (1.0, 4.0):
        x = (vals * scale).to(dtype).reshape(64, 1, 4)
        assert torch.equal(torch.isnan(x.float()), torch.isnan(vals.reshape(64, 1, 4) * scale))
        kc = torch.zeros(16, 4, 1, 4, dtype=torch.uint8)
        vc = torch.zeros_like(kc)
        slots = torch.arange(64, dtype=torch.int64)
        dk, dv = to_device(kc, device, fmt), to_device(vc, device, fmt)
        kx = to_device(x, device)
        if fmt in ("fp8_e4m3", "fp8_e5m2"):
            vllm.reshape_and_cache_flash(kx, kx, dk, dv, to_device(slots, device), fmt, scale, scale)
        else:
            kvhal.paged_caching(dk, dv, kx, kx, to_device(slots, device), scale, scale, cache_dtype=fmt)
        got = to_host(dk, kc).reshape(-1)
        ref = torch_fp8_encode(x.float().reshape(-1) / scale, fmt)
        assert torch.equal(got, ref), (fmt, dtype, scale, torch.nonzero(got != ref)[:4])
        assert torch.equal(to_host(dv, vc).reshape(-1), ref)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_all_f16_inputs(device, kv_cache_dtype):
    """All 65536 f16 values (NaNs, infinities, subnormals) over a scale that is not a power of two."""
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16).reshape(4096, 2, 8)
    kc = torch.zeros(1024, 4, 2, 8, dtype=torch.uint8)
    slots = torch.arange(4096, dtype=torch.int64)
    dk, dv = to_device(kc, device, kv_cache_dtype), to_device(kc.clone(), device, kv_cache_dtype)
    kx = to_device(x, device)
    vllm.reshape_and_cache_flash(kx, kx, dk, dv, to_device(slots, device), kv_cache_dtype, torch.tensor([0.37]),
                                 torch.tensor([3.0]))
    assert torch.equal(to_host(dk, kc).reshape(-1), torch_fp8_encode(x.float().reshape(-1) / 0.37, kv_cache_dtype))
    assert torch.equal(to_host(dv, kc).reshape(-1), torch_fp8_encode(x.float().reshape(-1) / 3.0, kv_cache_dtype))


def test_vllm_bad_arguments():
    key = torch.zeros(4, 2, 8, dtype=torch.float16)
    kc = torch.zeros(2, 4, 2, 8, dtype=torch.uint8)
    slots = torch.arange(4, dtype=torch.int64)
    with pytest.raises(kvhal.InvalidArgument, match="kv_cache_dtype"):
        vllm.reshape_and_cache_flash(key, key, kc, kc.clone(), slots, "int8", 1.0, 1.0)
    with pytest.raises(kvhal.Error, match="k_cache"):  # uint8 caches without an fp8 kv_cache_dtype
        vllm.reshape_and_cache_flash(key, key, kc, kc.clone(), slots, "auto", 1.0, 1.0)
    with pytest.raises(kvhal.InvalidArgument, match="k_scale"):
        vllm.reshape_and_cache_flash(key, key, kc, kc.clone(), slots, "fp8", "x", 1.0)
    with pytest.raises(kvhal.InvalidArgument, match="num_tokens"):  # more slots than tokens
        vllm.reshape_and_cache_flash(key, key, kc, kc.clone(), torch.arange(5), "fp8", 1.0, 1.0)
    with pytest.raises(kvhal.OutOfRange):
        vllm.reshape_and_cache_flash(key, key, kc, kc.clone(), slots + 8, "fp8", 1.0, 1.0)
    e4 = kvhal.empty((2, 4, 2, 8), "fp8_e4m3")
    with pytest.raises(kvhal.DtypeMismatch, match="cache_dtype"):  # an fp8 cache of another format
        vllm.reshape_and_cache_flash(key, key, e4, e4, slots, "fp8_e5m2", 1.0, 1.0)
    with pytest.raises(kvhal.InvalidArgument, match="cache_dtype"):
        kvhal.paged_caching(kc, kc, key, key, slots, cache_dtype="f16")
    with pytest.raises(kvhal.InvalidArgument, match="cache_dtype"):
        kvhal.paged_caching(kc, kc, key, key, slots, cache_dtype="nope")
    with pytest.raises(kvhal.InvalidArgument, match="layout"):
        kvhal.paged_caching(kc, kc, key, key, slots, cache_dtype="fp8_e4m3", layout="NDH")
    with pytest.raises(kvhal.InvalidArgument, match="num_tokens"):
        kvhal.paged_caching(kc, kc, key, key, slots, cache_dtype="fp8_e4m3", num_tokens=-1)


# ---- FlashInfer ----
def page_table(g, lens_before, appends, page_size, num_pages):
    """A FlashInfer page table for requests of lens_before + appends tokens over shuffled pages, and the appended
    entries' batch indices and positions (what flashinfer.get_batch_indices_positions gives)."""
    perm = torch.randperm(num_pages, generator=g)
    indptr, indices, last, b_idx, pos = [0], [], [], [], []
    for b, (before, add) in enumerate(zip(lens_before, appends)):
        total = before + add
        npages = (total + page_size - 1) // page_size
        indices += perm[indptr[-1]:indptr[-1] + npages].tolist()
        indptr.append(indptr[-1] + npages)
        last.append(total - (npages - 1) * page_size)
        b_idx += [b] * add
        pos += list(range(before, total))
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    return i32(b_idx), i32(pos), i32(indices), i32(indptr), i32(last)


def ref_append_paged_kv_cache(key, value, b_idx, pos, k_cache, v_cache, indices, indptr, layout):
    """FlashInfer's append in torch: entry i to page indices[indptr[b] + pos // page_size], entry pos % page_size."""
    page_size = k_cache.shape[1] if layout == "NHD" else k_cache.shape[2]
    for i in range(key.shape[0]):
        b, p = int(b_idx[i]), int(pos[i])
        page = int(indices[int(indptr[b]) + p // page_size])
        for src, dst in ((key, k_cache), (value, v_cache)):
            if layout == "NHD":
                dst[page, p % page_size] = src[i]
            else:
                dst[page, :, p % page_size] = src[i]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("form", ["tuple", "single"])
@pytest.mark.parametrize("index_kind", ["torch", "numpy"])
def test_flashinfer_append_paged_kv_cache(device, layout, form, index_kind):
    if index_kind == "torch" and not torch_device(device):
        pytest.skip("torch index arrays live on torch's devices")
    g = torch.Generator().manual_seed(11)
    page_size, num_pages, h, d = 4, 16, 2, 8
    b_idx, pos, indices, indptr, last = page_table(g, [3, 0, 8], [2, 5, 1], page_size, num_pages)
    nnz = b_idx.shape[0]
    key = torch.randn(nnz, h, d, generator=g).to(torch.float16)
    value = torch.randn(nnz, h, d, generator=g).to(torch.float16)
    shape = (num_pages, page_size, h, d) if layout == "NHD" else (num_pages, h, page_size, d)
    kv = torch.randn(num_pages, 2, *shape[1:], generator=g).to(torch.float16)
    rk, rv = kv[:, 0].clone(), kv[:, 1].clone()
    ref_append_paged_kv_cache(key, value, b_idx, pos, rk, rv, indices, indptr, layout)
    idx = [b_idx, pos, indices, indptr, last]
    if index_kind == "numpy":
        idx = [t.numpy() for t in idx]
    else:
        idx = [t.to(torch_device(device)) for t in idx]
    if form == "tuple":
        kc, vc = to_device(kv[:, 0].contiguous(), device), to_device(kv[:, 1].contiguous(), device)
        cache = (kc, vc)
    else:
        kc = to_device(kv, device)
        cache = kc
    flashinfer.append_paged_kv_cache(to_device(key, device), to_device(value, device), idx[0], idx[1], cache,
                                     idx[2], idx[3], idx[4], kv_layout=layout)
    if form == "tuple":
        gk, gv = to_host(kc, rk), to_host(vc, rv)
    else:
        both = to_host(kc, kv)
        gk, gv = both[:, 0], both[:, 1]
    assert torch.equal(bits(gk), bits(rk))
    assert torch.equal(bits(gv), bits(rv))


def test_flashinfer_bad_arguments():
    g = torch.Generator().manual_seed(3)
    b_idx, pos, indices, indptr, last = page_table(g, [2], [3], 4, 8)
    key = torch.zeros(3, 2, 8, dtype=torch.float16)
    kc = torch.zeros(8, 4, 2, 8, dtype=torch.float16)
    with pytest.raises(kvhal.InvalidArgument, match="kv_layout"):
        flashinfer.append_paged_kv_cache(key, key, b_idx, pos, (kc, kc.clone()), indices, indptr, last, "NDH")
    with pytest.raises(kvhal.InvalidArgument, match="paged_kv_cache"):
        flashinfer.append_paged_kv_cache(key, key, b_idx, pos, kc, indices, indptr, last)
    with pytest.raises(kvhal.InvalidArgument, match="paged_kv_cache"):
        flashinfer.append_paged_kv_cache(key, key, b_idx, pos, (kc,), indices, indptr, last)
    for positions in (pos + 4, pos - 3):  # past the request's sequence; negative
        with pytest.raises(kvhal.OutOfRange):
            flashinfer.append_paged_kv_cache(key, key, b_idx, positions, (kc, kc.clone()), indices, indptr, last)
        with pytest.raises(kvhal.OutOfRange):
            flashinfer.append_paged_kv_cache(key, key, b_idx.numpy(), positions.numpy(), (kc, kc.clone()),
                                             indices.numpy(), indptr.numpy(), last.numpy())
    with pytest.raises(kvhal.InvalidArgument, match="batch_indices"):
        flashinfer.append_paged_kv_cache(key, key, b_idx.numpy() + 1, pos.numpy(), (kc, kc.clone()),
                                         indices.numpy(), indptr.numpy(), last.numpy())
    with pytest.raises(kvhal.InvalidArgument, match="positions"):
        flashinfer.append_paged_kv_cache(key, key, b_idx.numpy(), pos.numpy().astype(np.float32), (kc, kc.clone()),
                                         indices.numpy(), indptr.numpy(), last.numpy())
    with pytest.raises(kvhal.InvalidArgument, match="k_cache"):  # v_cache=None needs [pages, 2, ...]
        kvhal.paged_caching(kc, None, key, key, torch.arange(3))


@pytest.mark.parametrize("spelling", ["float16", "half", "f16", "torch.float16"])
def test_dtype_names(spelling):
    assert kvhal.empty((2,), spelling).dtype == "f16"


def test_dtype_objects():
    assert kvhal.empty((2,), np.float16).dtype == "f16"
    assert kvhal.empty((2,), np.dtype("int64")).dtype == "i64"
    assert kvhal.empty((2,), torch.bfloat16).dtype == "bf16"
    assert kvhal.empty((2,), torch.float32).dtype == "f32"
    assert kvhal.empty((2,), "float8_e4m3fn").dtype == "fp8_e4m3"
    with pytest.raises(kvhal.InvalidArgument, match="dtype"):
        kvhal.empty((2,), np.complex64)
    with pytest.raises(kvhal.InvalidArgument, match="dtype"):
        kvhal.empty((2,), torch.uint8)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "i32", "i64", "fp8_e4m3fnuz",
                                   "fp8_e5m2fnuz"])
def test_every_export_in_bounds(dtype):
    """Each dtype's DLPack export describes exactly the tensor's bytes (never a wider element)."""
    t = kvhal.empty((4,), dtype)
    cap = t.__dlpack__()
    itemsize = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "i64": 8}.get(dtype, 1)
    if dtype == "bf16":
        x = torch.utils.dlpack.from_dlpack(cap)
    else:
        x = np.from_dlpack(t)
    assert x.nbytes == 4 * itemsize if hasattr(x, "nbytes") else x.numel() * x.element_size() == 4 * itemsize
