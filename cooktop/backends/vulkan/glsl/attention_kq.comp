#version 450
// Attention without flash attention, llama.cpp's build_attn_mha with flash_attn off: the scores
// KQ = K^T Q * scale materialised in a scratch buffer, soft_max_ext over them, then KQV = V KQ.
// One source, three variants (one dispatch each per chunk of tokens and heads; device.py):
//   KQ:      S[tt, hh, j] = scale * q[t0+tt, h0+hh] . k[j, kv head]   one workgroup per (head, token),
//            WG columns at a time
//   SOFTMAX: each row S[tt, hh, k0..pos] in place, float32 (sinks: one more logit in the max and the
//            denominator, no value; ggml_soft_max_add_sinks)         one workgroup per (head, token)
//   KQV:     out[t0+tt, h0+hh, d] = sum_j S[tt, hh, j] v[j, kv head, d]   one invocation per (d, head, token)
// q, out f32 [n, n_head * head_dim]; k, v [n_cells, n_head_kv * head_dim] of the cache types kt and vt
// (push constants; kv.glsl), read as stored; pos, S0 int32 [n]; S f32 [hc * nt rows, n_ctx].
// Row t attends to columns k0..pos[t], k0 = max(S0[t] if has_start, pos[t] + 1 - window if window > 0).
#extension GL_GOOGLE_include_directive : require
#define WG 64
layout(local_size_x = WG) in;
#if defined(KQ)
layout(std430, binding = 0) readonly buffer QBuf { float Q[]; };
layout(std430, binding = 1) readonly buffer KBuf { uint K[]; };
layout(std430, binding = 2) readonly buffer PBuf { int P[]; };
layout(std430, binding = 3) readonly buffer SBuf { int S0[]; };
layout(std430, binding = 4) writeonly buffer ScBuf { float S[]; };
#elif defined(SOFTMAX)
layout(std430, binding = 0) buffer ScBuf { float S[]; };
layout(std430, binding = 1) readonly buffer PBuf { int P[]; };
layout(std430, binding = 2) readonly buffer SBuf { int S0[]; };
layout(std430, binding = 3) readonly buffer SkBuf { float SK[]; };
#else
layout(std430, binding = 0) readonly buffer ScBuf { float S[]; };
layout(std430, binding = 1) readonly buffer VBuf { uint V[]; };
layout(std430, binding = 2) readonly buffer PBuf { int P[]; };
layout(std430, binding = 3) readonly buffer SBuf { int S0[]; };
layout(std430, binding = 4) writeonly buffer OBuf { float O[]; };
#endif
layout(push_constant) uniform PC {
    uint nt; uint n_head; uint n_head_kv; uint head_dim; uint n_ctx; uint scale_bits; uint window; uint has_start;
    uint kvt; uint t0; uint h0; uint hc; uint has_sinks;
} pc;
#include "common.glsl"
#include "kv.glsl"
#if defined(KQ)
KV_LOADER(load_k, K)
#define KQ_SPAN WG
#elif !defined(SOFTMAX)
KV_LOADER(load_v, V)
#define KQ_SPAN pc.head_dim
#endif

// the columns row t reads: [k0, n_kv)
void span(uint t, out uint k0, out uint n_kv) {
    n_kv = uint(clamp(P[t] + 1, 1, int(pc.n_ctx)));
    int s0 = pc.has_start != 0u ? clamp(S0[t], 0, int(n_kv) - 1) : 0;
    k0 = uint(max(s0, pc.window > 0u ? int(n_kv) - int(pc.window) : 0));
}

#ifdef SOFTMAX
shared float red[WG];
#endif

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint g = flat_group();
#if defined(SOFTMAX)
    uint hh = g % pc.hc, tt = g / pc.hc;
    if (tt >= pc.nt) return;  // uniform over the workgroup
    uint k0, n_kv;
    span(pc.t0 + tt, k0, n_kv);
    uint ro = (tt * pc.hc + hh) * pc.n_ctx;
    float m = pc.has_sinks != 0u ? SK[pc.h0 + hh] : -1.0 / 0.0;
    for (uint j = k0 + tid; j < n_kv; j += WG) m = max(m, S[ro + j]);
    red[tid] = m;
    barrier();
    for (uint st = WG / 2u; st > 0u; st >>= 1) {
        if (tid < st) red[tid] = max(red[tid], red[tid + st]);
        barrier();
    }
    m = red[0];
    barrier();
    float l = 0.0;
    for (uint j = k0 + tid; j < n_kv; j += WG) {
        float e = exp(S[ro + j] - m);
        S[ro + j] = e;
        l += e;
    }
    red[tid] = l;
    barrier();
    for (uint st = WG / 2u; st > 0u; st >>= 1) {
        if (tid < st) red[tid] += red[tid + st];
        barrier();
    }
    l = red[0];
    if (pc.has_sinks != 0u) l += exp(SK[pc.h0 + hh] - m);
    float inv = 1.0 / l;
    for (uint j = k0 + tid; j < n_kv; j += WG) S[ro + j] *= inv;
#else
    uint hd = pc.head_dim;
    uint per = (KQ_SPAN + WG - 1u) / WG;  // workgroups along d (KQV; KQ: one, looping over j)
    uint x = (g % per) * WG + tid;
    uint hh = (g / per) % pc.hc, tt = g / per / pc.hc;
    if (tt >= pc.nt) return;
    uint t = pc.t0 + tt, h = pc.h0 + hh;
    uint k0, n_kv;
    span(t, k0, n_kv);
    uint kv_dim = pc.n_head_kv * hd;
    uint ko = (h / (pc.n_head / pc.n_head_kv)) * hd;
    uint ro = (tt * pc.hc + hh) * pc.n_ctx;
#if defined(KQ)
    uint krb = kv_row_bytes(pc.kvt, kv_dim);
    uint qo = (t * pc.n_head + h) * hd;
    for (uint j = k0 + x; j < n_kv; j += WG) {
        float s = 0.0;
        for (uint d = 0u; d < hd; d++) s += Q[qo + d] * load_k(pc.kvt, j * krb, ko + d);
        S[ro + j] = s * uintBitsToFloat(pc.scale_bits);
    }
#else
    if (x >= hd) return;
    uint vrb = kv_row_bytes(pc.kvt, kv_dim);
    float a = 0.0;
    for (uint j = k0; j < n_kv; j++) a += S[ro + j] * load_v(pc.kvt, j * vrb, ko + x);
    O[(t * pc.n_head + h) * hd + x] = a;
#endif
#endif
}
