// kv_store into a cache of type KTYPE (kv.cl): cache[pos[t], :] = x[t, :] as stored.
// f32 copied; f16 rounded to nearest even (vstore_half); bf16 rounded to nearest even with NaNs
// kept quiet (ggml_compute_fp32_to_bf16); q8_0 and q4_0 one block of 32 per work-item with ggml's
// quantize_row_q8_0_ref / quantize_row_q4_0_ref rounding (ggml-quants.c). Built without
// -cl-mad-enable and with FP_CONTRACT off so that x * id + 8.5f rounds twice, as in C; 1 / d gets
// one Newton step, amax / 127 a residual correction (a device's division may be 2.5 ulp off without
// -cl-fp32-correctly-rounded-divide-sqrt).
// Global (units per row, n_tok), units = values (float types) or blocks; rows with pos outside
// [0, n_ctx) are skipped.
#pragma OPENCL FP_CONTRACT OFF

inline float kv_recip(const float d) {
    const float r = 1.0f / d;
    return fma(fma(-d, r, 1.0f), r, r);
}

inline float kv_div(const float a, const float b) {  // a / b, as C rounds it
    const float q = a / b;
    return fma(fma(-q, b, a), kv_recip(b), q);
}

__kernel void kv_store_t(global uchar *cache, const global float *x, const global int *pos,
                         const int dim, const int n_ctx) {
    const int j = get_global_id(0);
    const int t = get_global_id(1);
    const int p = pos[t];
    if (p < 0 || p >= n_ctx) return;
    global uchar *row = cache + (size_t)p * kv_row_bytes(KTYPE, dim);
    const global float *xr = x + (size_t)t * dim;
#if KTYPE == KV_F32 || KTYPE == KV_F16 || KTYPE == KV_BF16
    if (j >= dim) return;
    const float v = xr[j];
#if KTYPE == KV_F32
    ((global float *)row)[j] = v;
#elif KTYPE == KV_F16
    vstore_half(v, j, (global half *)row);
#else
    const uint u = as_uint(v);
    ((global ushort *)row)[j] = (u & 0x7fffffffu) > 0x7f800000u ? (ushort)((u >> 16) | 64)
                                                                  : (ushort)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
#endif
#else
    if (j >= dim / 32) return;
    const global float *xb = xr + j * 32;
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
#endif
}
