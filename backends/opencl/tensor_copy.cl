/* tensor_copy.cl — dst = src for two tensors of one shape and dtype with any strides. The host drops size-1 dims
 * and merges dims that are dense in both tensors, so NDIM (1..6) is the number left. Built with:
 *   NDIM   dims after merging; ESIZE  element bytes;  UNIT  bytes one work-item moves in tensor_copy_vec
 * tensor_copy_vec moves units of UNIT = VEC * ESIZE bytes (the innermost dim is contiguous in both tensors when
 * VEC > 1) with one typed load; shape and strides are in units and both base offsets are multiples of UNIT.
 * tensor_copy_any moves single elements byte by byte (shape and strides in elements, any offset). Index
 * arithmetic uses 32 bits when the host says every index fits (small != 0). One work-item per unit, items
 * base + get_global_id(0) < total: a launch covers at most 2^30 of them. */

#if UNIT == 16
#define TC_T uint4
#elif UNIT == 8
#define TC_T uint2
#elif UNIT == 4
#define TC_T uint
#elif UNIT == 2
#define TC_T ushort
#else
#define TC_T uchar
#endif

/* Unpacks a ulong8 argument into a private array: passing ulong8 values on to functions would change the calling
 * convention of some CPU devices (PoCL warns about it). */
#define TC_UNPACK(a, v) const ulong a[8] = {v.s0, v.s1, v.s2, v.s3, v.s4, v.s5, v.s6, v.s7}

void tc_offsets(ulong i, const ulong *sh, const ulong *ds, const ulong *ss, uint small, ulong *dofs,
                       ulong *sofs)
{
    ulong d = 0, s = 0;
    if (small) {
        uint rem = (uint)i;
        for (int k = NDIM - 1; k > 0; k--) {
            uint n = (uint)sh[k], q = rem / n, x = rem - q * n;
            d += (ulong)x * ds[k];
            s += (ulong)x * ss[k];
            rem = q;
        }
        d += (ulong)rem * ds[0];
        s += (ulong)rem * ss[0];
    } else {
        ulong rem = i;
        for (int k = NDIM - 1; k > 0; k--) {
            ulong q = rem / sh[k], x = rem - q * sh[k];
            d += x * ds[k];
            s += x * ss[k];
            rem = q;
        }
        d += rem * ds[0];
        s += rem * ss[0];
    }
    *dofs = d;
    *sofs = s;
}

kernel void tensor_copy_vec(global uchar *dst, ulong dst_off, const global uchar *src, ulong src_off, ulong8 shape,
                            ulong8 dstr, ulong8 sstr, ulong base, ulong total, uint small)
{
    const ulong i = base + get_global_id(0);
    if (i >= total) return;
    TC_UNPACK(sh, shape);
    TC_UNPACK(ds, dstr);
    TC_UNPACK(ss, sstr);
    ulong di, si;
    tc_offsets(i, sh, ds, ss, small, &di, &si);
    ((global TC_T *)(dst + dst_off))[di] = ((const global TC_T *)(src + src_off))[si];
}

kernel void tensor_copy_any(global uchar *dst, ulong dst_off, const global uchar *src, ulong src_off, ulong8 shape,
                            ulong8 dstr, ulong8 sstr, ulong base, ulong total, uint small)
{
    const ulong i = base + get_global_id(0);
    if (i >= total) return;
    TC_UNPACK(sh, shape);
    TC_UNPACK(ds, dstr);
    TC_UNPACK(ss, sstr);
    ulong di, si;
    tc_offsets(i, sh, ds, ss, small, &di, &si);
    for (int b = 0; b < ESIZE; b++) dst[dst_off + di * ESIZE + b] = src[src_off + si * ESIZE + b];
}
