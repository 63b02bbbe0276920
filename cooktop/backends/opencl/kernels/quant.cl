// 8-bit quantization of activations for the integer-dot matmuls (dotq8.cl), alone or
// fused into the op that produces the matmul's input.
//
// Per 32 values (llama.cpp quantize_row_q8_1, ggml-quants.c): d = max|x| / 127,
// q = round(x / d) (ties to even here; llama.cpp rounds half away from zero),
// s = d * sum(q). Layout: xq char [n_rows, n] and xd float2 [n_rows, n / 32] = (d, s).
// Every kernel here needs n % 32 == 0 (the host checks).

inline float hmax16(float16 v) {
    float8 m8 = fmax(v.lo, v.hi);
    float4 m4 = fmax(m8.lo, m8.hi);
    float2 m2 = fmax(m4.lo, m4.hi);
    return fmax(m2.x, m2.y);
}

// Quantize the 32 values (a, b) into block ib of a row's planes.
inline void store_q8(float16 a, float16 b, global char *xq, global float2 *xd, size_t ib) {
    const float amax = hmax16(fmax(fabs(a), fabs(b)));
    const float d = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int16 qa = convert_int16(rint(a * id)), qb = convert_int16(rint(b * id));
    vstore16(convert_char16(qa), 0, xq + ib * 32);
    vstore16(convert_char16(qb), 1, xq + ib * 32);
    const int16 s16 = qa + qb;
    const int8 s8 = s16.lo + s16.hi;
    const int4 s4 = s8.lo + s8.hi;
    const int2 s2 = s4.lo + s4.hi;
    xd[ib] = (float2)(d, d * (float)(s2.x + s2.y));
}

// x f32 [n_rows, n] -> (xq, xd); global (n / 32, n_rows), one block per work-item.
__kernel void quantize_q8(const global float *x, global char *xq, global float2 *xd, const int n) {
    const int ib = get_global_id(0);
    const size_t r = get_global_id(1);
    if (ib >= n / 32) return;
    const global float *xr = x + r * n;
    store_q8(vload16(2 * ib, xr), vload16(2 * ib + 1, xr), xq + r * n, xd + r * (n / 32), ib);
}

// rmsnorm (norm.cl) that also writes its output quantized: one group of RN_LS per row.
// out may alias x.
__kernel void rmsnorm_q8(global float *out, const global float *x, const global float *w, const int n,
                         const float eps, global char *xq, global float2 *xd) {
    const int lid = get_local_id(0);
    const size_t r = get_group_id(1);
    const size_t off = r * n;
    local float red[RN_LS];
    float16 s = (float16)(0.0f);
    for (int i = lid; i < n / 16; i += RN_LS) {
        const float16 v = vload16(i, x + off);
        s = fma(v, v, s);
    }
    const float8 s8 = s.lo + s.hi;
    const float4 s4 = s8.lo + s8.hi;
    const float2 s2 = s4.lo + s4.hi;
    red[lid] = s2.x + s2.y;
    // global fence too: out may alias x, and the loop below writes 32-value blocks that other
    // work-items read as 16-value chunks above (a read-write race without it; Oclgrind finds it)
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    for (int k = RN_LS / 2; k > 0; k >>= 1) {
        if (lid < k) red[lid] += red[lid + k];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float scale = 1.0f / sqrt(red[0] / (float)n + eps);
    for (int ib = lid; ib < n / 32; ib += RN_LS) {
        const float16 a = vload16(2 * ib, x + off) * scale * vload16(2 * ib, w);
        const float16 b = vload16(2 * ib + 1, x + off) * scale * vload16(2 * ib + 1, w);
        vstore16(a, 2 * ib, out + off);
        vstore16(b, 2 * ib + 1, out + off);
        store_q8(a, b, xq + off, xd + r * (n / 32), ib);
    }
}

// out = silu(gate) * up (elementwise.cl), also quantized; [n_rows, n], global (n / 32, n_rows).
__kernel void silu_mul_q8(global float *out, const global float *gate, const global float *up, const int n,
                          global char *xq, global float2 *xd) {
    const int ib = get_global_id(0);
    const size_t r = get_global_id(1);
    if (ib >= n / 32) return;
    const size_t off = r * n;
    const float16 ga = vload16(2 * ib, gate + off), gb = vload16(2 * ib + 1, gate + off);
    const float16 a = ga / (1.0f + exp(-ga)) * vload16(2 * ib, up + off);
    const float16 b = gb / (1.0f + exp(-gb)) * vload16(2 * ib + 1, up + off);
    vstore16(a, 2 * ib, out + off);
    vstore16(b, 2 * ib + 1, out + off);
    store_q8(a, b, xq + off, xd + r * (n / 32), ib);
}

// llama.cpp's block_q8_K (ggml-common.h: one scale per 256 values and the sums of quants per
// 16) for the K-quant integer-dot matmuls (dotq8k.cl), quantize_row_q8_K_ref (ggml-quants.c):
// max = the first value of largest |x|, iscale = -127 / max, q = min(127, rint(iscale * x)),
// d = 1 / iscale. Layout: xq char [n_rows, n] as for q8_1, and per super-block a record of 16
// floats in the xd plane: short bsums[16] (floats 0..7), float d (float 8), 7 unused.
// Every kernel here needs n % 256 == 0 (the host checks).

// Quantize the 256 values at v (written by this work-item or read-only) into xq and rec.
inline void store_q8k(const global float *v, global char *xq, global float *rec) {
    float amax = 0.0f;
    for (int i = 0; i < 16; i++) amax = fmax(amax, hmax16(fabs(vload16(i, v))));
    float mx = 0.0f;
    for (int i = 0; i < 256; i++) {
        if (fabs(v[i]) == amax) {
            mx = v[i];
            break;
        }
    }
    const float iscale = amax > 0.0f ? -127.0f / mx : 0.0f;
    global short *bs = (global short *)rec;
    for (int i = 0; i < 16; i++) {
        const int16 q = min(convert_int16(rint(vload16(i, v) * iscale)), (int16)(127));  // a vector bound: Oclgrind 21.10 gave wrong values with min(int16, int)
        vstore16(convert_char16(q), i, xq);
        const int8 s8 = q.lo + q.hi;
        const int4 s4 = s8.lo + s8.hi;
        const int2 s2 = s4.lo + s4.hi;
        bs[i] = (short)(s2.x + s2.y);
    }
    rec[8] = amax > 0.0f ? 1.0f / iscale : 0.0f;
}

// x f32 [n_rows, n] -> (xq, records); global (n / 256, n_rows), one super-block per work-item.
__kernel void quantize_q8k(const global float *x, global char *xq, global float *xk, const int n) {
    const int ib = get_global_id(0);
    const size_t r = get_global_id(1);
    if (ib >= n / 256) return;
    const size_t off = r * n + (size_t)ib * 256;
    store_q8k(x + off, xq + off, xk + (r * (n / 256) + ib) * 16);
}

// rmsnorm_q8 writing block_q8_K: one group of RN_LS per row, one super-block per work-item.
// out may alias x.
__kernel void rmsnorm_q8k(global float *out, const global float *x, const global float *w, const int n,
                          const float eps, global char *xq, global float *xk) {
    const int lid = get_local_id(0);
    const size_t r = get_group_id(1);
    const size_t off = r * n;
    local float red[RN_LS];
    float16 s = (float16)(0.0f);
    for (int i = lid; i < n / 16; i += RN_LS) {
        const float16 v = vload16(i, x + off);
        s = fma(v, v, s);
    }
    const float8 s8 = s.lo + s.hi;
    const float4 s4 = s8.lo + s8.hi;
    const float2 s2 = s4.lo + s4.hi;
    red[lid] = s2.x + s2.y;
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);  // out may alias x (rmsnorm_q8)
    for (int k = RN_LS / 2; k > 0; k >>= 1) {
        if (lid < k) red[lid] += red[lid + k];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float scale = 1.0f / sqrt(red[0] / (float)n + eps);
    for (int ib = lid; ib < n / 256; ib += RN_LS) {
        const size_t o = off + (size_t)ib * 256;
        for (int i = 0; i < 16; i++)
            vstore16(vload16(i, x + o) * scale * vload16(16 * ib + i, w), i, out + o);
        store_q8k(out + o, xq + o, xk + (r * (n / 256) + ib) * 16);
    }
}

// out = silu(gate) * up writing block_q8_K; [n_rows, n], global (n / 256, n_rows).
__kernel void silu_mul_q8k(global float *out, const global float *gate, const global float *up, const int n,
                           global char *xq, global float *xk) {
    const int ib = get_global_id(0);
    const size_t r = get_global_id(1);
    if (ib >= n / 256) return;
    const size_t o = r * n + (size_t)ib * 256;
    for (int i = 0; i < 16; i++) {
        const float16 g = vload16(i, gate + o);
        vstore16(g / (1.0f + exp(-g)) * vload16(i, up + o), i, out + o);
    }
    store_q8k(out + o, xq + o, xk + (r * (n / 256) + ib) * 16);
}
