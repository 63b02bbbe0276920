// kv_store into a cache of type KTYPE (kv.cl): cache[pos[t], :] = x[t, :] as stored.
// f32 copied; f16 rounded to nearest even (vstore_half); bf16 rounded to nearest even with NaNs
// kept quiet (ggml_compute_fp32_to_bf16); q8_0 and q4_0 one block of 32 per work-item with ggml's
// quantize_row_q8_0_ref / quantize_row_q4_0_ref rounding (ggml-quants.c). Built without
// -cl-mad-enable and with FP_CONTRACT off so that x * id + 8.5f rounds twice, as in C; 1 / d gets
// one Newton step, amax / 127 a residual correction (a device's division may be 2.5 ulp off without
// -cl-fp32-correctly-rounded-divide-sqrt).
// Global (units per row, n_tok), units = values (float types) or blocks; rows with pos outside
// [0, n_ctx) are skipped.
// rope_store: rope (rope.cl's rope_cs / rope_rot, the same roundings as the rope kernel) of x's
// rows by pos, stored in the cache rows cells, in one launch (llama.cpp's backends fuse rope and
// set_rows alike). Float caches: global (head_dim / 2, n_tok), rope's own layout (a pair's angle
// once for every head); block caches: kv_store_t's global size, a work-item ropes its block's values.
#pragma OPENCL FP_CONTRACT OFF

inline float kv_recip(const float d) {
    const float r = 1.0f / d;
    return fma(fma(-d, r, 1.0f), r, r);
}

inline float kv_div(const float a, const float b) {  // a / b, as C rounds it
    const float q = a / b;
    return fma(fma(-q, b, a), kv_recip(b), q);
}

#if KTYPE == KV_F32 || KTYPE == KV_F16 || KTYPE == KV_BF16
#define KV_UNIT 1
// value j of a row, stored as KTYPE
inline void kv_put(global uchar *row, const int j, const float v) {
#if KTYPE == KV_F32
    ((global float *)row)[j] = v;
#elif KTYPE == KV_F16
    vstore_half(v, j, (global half *)row);
#else
    const uint u = as_uint(v);
    ((global ushort *)row)[j] = (u & 0x7fffffffu) > 0x7f800000u ? (ushort)((u >> 16) | 64)
                                                                  : (ushort)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
#endif
}
#else
#define KV_UNIT 32
// block j of a row (values xb[0..31]), quantized as KTYPE
inline void kv_put_block(global uchar *row, const int j, const float *xb) {
    global uchar *b = row + (size_t)j * (KTYPE == KV_Q8_0 ? 34 : 18);
#if KTYPE == KV_Q8_0
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = fmax(amax, fabs(xb[i]));
    const float d = kv_div(amax, 127.0f);
    const float id = d != 0.0f ? kv_recip(d) : 0.0f;
    vstore_half(d, 0, (global half *)b);
    for (int i = 0; i < 32; i++) ((global char *)(b + 2))[i] = (char)round(xb[i] * id);
#else
    float amax = 0.0f, mx = 0.0f;  // the value of largest magnitude, its sign kept (the first of equals)
    for (int i = 0; i < 32; i++) {
        const float v = xb[i];
        if (amax < fabs(v)) { amax = fabs(v); mx = v; }
    }
    const float d = mx / -8.0f;
    const float id = d != 0.0f ? kv_recip(d) : 0.0f;
    vstore_half(d, 0, (global half *)b);
    for (int i = 0; i < 16; i++) {
        const float a = xb[i] * id, c = xb[16 + i] * id;
        const int q0 = min(15, (int)(char)(a + 8.5f)), q1 = min(15, (int)(char)(c + 8.5f));
        b[2 + i] = (uchar)(q0 | (q1 << 4));
    }
#endif
}
#endif

__kernel void kv_store_t(global uchar *cache, const global float *x, const global int *pos,
                         const int dim, const int n_ctx) {
    const int j = get_global_id(0);
    const int t = get_global_id(1);
    const int p = pos[t];
    if (p < 0 || p >= n_ctx || j >= dim / KV_UNIT) return;
    global uchar *row = cache + (size_t)p * kv_row_bytes(KTYPE, dim);
    const global float *xr = x + (size_t)t * dim;
#if KV_UNIT == 1
    kv_put(row, j, xr[j]);
#else
    float xb[32];
    for (int i = 0; i < 32; i++) xb[i] = xr[j * 32 + i];
    kv_put_block(row, j, xb);
#endif
}

// value e of row xr (heads of head_dim values) after rope by position p: rope's arithmetic for
// the pair that holds e (mode 0: (2i, 2i+1), mode 2: (i, i + n_rot/2)); e past n_rot in its head: as is
inline float rope_value(const global float *xr, const int e, const int p, const int head_dim, const int n_rot,
                        const float freq_base, const float freq_scale, const int mode, const global float *ff,
                        const int has_ff, const float ext_factor, const float mscale, const float corr0,
                        const float corr1) {
    const int d = e % head_dim, base = e - d, half_rot = n_rot / 2;
    if (d >= n_rot) return xr[e];
    const int first = mode == 2 ? d < half_rot : (d & 1) == 0;
    const int i = mode == 2 ? (first ? d : d - half_rot) : d / 2;
    const int i0 = mode == 2 ? i : 2 * i, i1 = mode == 2 ? i + half_rot : 2 * i + 1;
    const float2 cs = rope_cs(p, i, n_rot, freq_base, freq_scale, ff, has_ff, ext_factor, mscale, corr0, corr1);
    const float2 r = rope_rot(xr[base + i0], xr[base + i1], cs);
    return first ? r.x : r.y;
}

__kernel void rope_store(global uchar *cache, const global float *x, const global int *pos,
                         const global int *cells, const int dim, const int n_ctx, const int head_dim,
                         const int n_rot, const float freq_base, const float freq_scale, const int mode,
                         const global float *ff, const int has_ff, const float ext_factor, const float mscale,
                         const float corr0, const float corr1) {
    const int j = get_global_id(0);
    const int t = get_global_id(1);
    const int c = cells[t];
    const global float *xr = x + (size_t)t * dim;
    const int p = pos[t];
#if KV_UNIT == 1
    // global (head_dim / 2, n_tok) as rope: pair j's angle once, every head's pair rotated and stored
    const int half_rot = n_rot / 2;
    if (c < 0 || c >= n_ctx || j >= head_dim / 2) return;
    global uchar *row = cache + (size_t)c * kv_row_bytes(KTYPE, dim);
    if (j < half_rot) {
        const float2 cs = rope_cs(p, j, n_rot, freq_base, freq_scale, ff, has_ff, ext_factor, mscale, corr0, corr1);
        const int i0 = mode == 2 ? j : 2 * j, i1 = mode == 2 ? j + half_rot : 2 * j + 1;
        for (int base = 0; base < dim; base += head_dim) {
            const float2 r = rope_rot(xr[base + i0], xr[base + i1], cs);
            kv_put(row, base + i0, r.x);
            kv_put(row, base + i1, r.y);
        }
    } else {
        const int e = n_rot + 2 * (j - half_rot);
        for (int base = 0; base < dim; base += head_dim) {
            kv_put(row, base + e, xr[base + e]);
            kv_put(row, base + e + 1, xr[base + e + 1]);
        }
    }
#else
    // global (blocks per row, n_tok): the block's 32 values roped one by one, then quantized
    if (c < 0 || c >= n_ctx || j >= dim / 32) return;
    global uchar *row = cache + (size_t)c * kv_row_bytes(KTYPE, dim);
    float xb[32];
    for (int i = 0; i < 32; i++)
        xb[i] = rope_value(xr, j * 32 + i, p, head_dim, n_rot, freq_base, freq_scale, mode, ff, has_ff,
                           ext_factor, mscale, corr0, corr1);
    kv_put_block(row, j, xb);
#endif
}
