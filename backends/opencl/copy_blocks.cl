/* copy_blocks.cl — copies whole blocks src -> dst in every cache, for every pair, in one launch. OpenCL 1.2 has no
 * pointers to buffers in device memory, so a launch takes up to 16 distinct buffers as arguments (b0..b15); when
 * the caches span more buffers the host launches once per group of 16. One uploaded buffer `meta` holds per pair
 * two longs (src, dst block), then from meta[table_off] per cache of this launch four ulongs (argument index, byte
 * offset of block 0, block stride, block bytes). A job is one (cache, pair); job j is cache j / num_pairs, pair
 * j % num_pairs; a work-item moves CB_GROUP units of one job (units_per_job = work-items per job, for the largest
 * block of the launch; units past a smaller block are skipped): consecutive ones on CPU devices (CB_INTERLEAVE 0),
 * where per-item index math would dominate, and units_per_job apart on GPUs (CB_INTERLEAVE 1), so that each of a
 * work-item's loads is coalesced with its neighbours' and all CB_GROUP loads are in flight before the first store
 * (one 16-byte unit per work-item left a GPU waiting on the table loads of every 16 bytes). A launch
 * covers `items` work-items from job job0 on (at most 2^30). The host picks the kernel whose unit (16, 4 or 1
 * bytes) divides every offset, stride and block size. */

#define CB_PICK(i)                                                                                              \
    ((i) == 0 ? b0 : (i) == 1 ? b1 : (i) == 2 ? b2 : (i) == 3 ? b3 : (i) == 4 ? b4 : (i) == 5 ? b5               \
     : (i) == 6 ? b6 : (i) == 7 ? b7 : (i) == 8 ? b8 : (i) == 9 ? b9 : (i) == 10 ? b10 : (i) == 11 ? b11       \
     : (i) == 12 ? b12 : (i) == 13 ? b13 : (i) == 14 ? b14 : b15)

#define CB_KERNEL(NAME, T, UNIT)                                                                                \
    kernel void NAME(global uchar *b0, global uchar *b1, global uchar *b2, global uchar *b3, global uchar *b4,  \
                     global uchar *b5, global uchar *b6, global uchar *b7, global uchar *b8, global uchar *b9,  \
                     global uchar *b10, global uchar *b11, global uchar *b12, global uchar *b13,               \
                     global uchar *b14, global uchar *b15, const global ulong *meta, ulong table_off,          \
                     uint num_pairs, uint units_per_job, ulong job0, uint items)                               \
    {                                                                                                          \
        const uint i = (uint)get_global_id(0);                                                                 \
        if (i >= items) return;                                                                                \
        const ulong job = job0 + i / units_per_job;                                                            \
        const uint u = (i % units_per_job) * CB_GROUP;                                                         \
        /* 32-bit division whenever the job index allows (a 64-bit one costs several times more on GPUs) */    \
        const ulong c = job >> 32 ? job / num_pairs : (ulong)((uint)job / num_pairs), p = job - c * num_pairs;  \
        const global ulong *e = meta + table_off + 4 * c;                                                      \
        const ulong n = e[3] / (UNIT);                                                                         \
        if (!CB_INTERLEAVE && u >= n) return;                                                                  \
        const global long *pairs = (const global long *)meta;                                                  \
        global uchar *base = CB_PICK(e[0]) + e[1];                                                             \
        const global T *src = (const global T *)(base + pairs[2 * p] * (long)e[2]);                            \
        global T *dst = (global T *)(base + pairs[2 * p + 1] * (long)e[2]);                                    \
        if (CB_INTERLEAVE) {                                                                                   \
            const ulong k = i % units_per_job;                                                                 \
            T v[CB_GROUP];                                                                                     \
            for (uint g = 0; g < CB_GROUP; g++)                                                                \
                if (k + (ulong)g * units_per_job < n) v[g] = src[k + (ulong)g * units_per_job];                \
            for (uint g = 0; g < CB_GROUP; g++)                                                                \
                if (k + (ulong)g * units_per_job < n) dst[k + (ulong)g * units_per_job] = v[g];                \
        } else {                                                                                               \
            for (uint g = 0; g < CB_GROUP; g++)                                                                \
                if (u + g < n) dst[u + g] = src[u + g];                                                        \
        }                                                                                                      \
    }

CB_KERNEL(copy_blocks_16, uint4, 16)
CB_KERNEL(copy_blocks_4, uint, 4)
CB_KERNEL(copy_blocks_1, uchar, 1)
