#version 450
// Query-tiled flash attention for prompts (n > 1): a workgroup of QT * DS invocations takes QT
// consecutive query rows of one head and walks the union of their key ranges in tiles of KT keys.
// Each tile's K and V rows are loaded (from the cache's own type, kv.glsl) into shared memory once
// for all QT queries; the QT x KT scores go to shared memory, masked per query (causal, kv_start,
// window) with -inf, and each query keeps an online softmax (running max, sum, rescaled
// accumulators) over the tiles: never the n x n_kv score matrix. Invocation (query qi, slice ds)
// owns output values d = ds, ds + DS, ... (head_dim <= HD_MAX). Bindings and push constants are
// attention.comp's (SINKS likewise); one workgroup per (tile, head): g = tile * n_head + h.
#extension GL_GOOGLE_include_directive : require
#define QT 16
#define DS 4
#define KT 8
#define HD_MAX 128
#define WG (QT * DS)
#define HPD (HD_MAX / DS)
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer QBuf { float Q[]; };
layout(std430, binding = 1) readonly buffer KBuf { uint K[]; };
layout(std430, binding = 2) readonly buffer VBuf { uint V[]; };
layout(std430, binding = 3) readonly buffer PBuf { int P[]; };
layout(std430, binding = 4) readonly buffer SBuf { int S0[]; };
layout(std430, binding = 5) writeonly buffer OBuf { float O[]; };
#ifdef SINKS
layout(std430, binding = 6) readonly buffer SkBuf { float SK[]; };
#endif
layout(push_constant) uniform PC {
    uint n; uint n_head; uint n_head_kv; uint head_dim; uint n_ctx; uint scale_bits; uint window; uint has_start;
    uint kt; uint vt;
} pc;
#include "common.glsl"
#include "kv.glsl"
KV_LOADER(load_k, K)
KV_LOADER(load_v, V)

shared float qs[QT * HD_MAX];
shared float ks[KT * HD_MAX];
shared float vs[KT * HD_MAX];
shared float sc[QT * KT];

// the keys row t attends to: [k0, n_kv)
void span(uint t, out uint k0, out uint n_kv) {
    n_kv = uint(clamp(P[t] + 1, 1, int(pc.n_ctx)));
    int s0 = pc.has_start != 0u ? clamp(S0[t], 0, int(n_kv) - 1) : 0;
    k0 = uint(max(s0, pc.window > 0u ? int(n_kv) - int(pc.window) : 0));
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint g = flat_group();
    uint h = g % pc.n_head;
    uint t0 = (g / pc.n_head) * QT;
    if (t0 >= pc.n) return;  // uniform over the workgroup
    uint hd = pc.head_dim;
    uint nq = min(uint(QT), pc.n - t0);
    uint kv_dim = pc.n_head_kv * hd;
    uint krb = kv_row_bytes(pc.kt, kv_dim), vrb = kv_row_bytes(pc.vt, kv_dim);
    uint ko = (h / (pc.n_head / pc.n_head_kv)) * hd;
    float scale = uintBitsToFloat(pc.scale_bits);
    uint lo = 0xFFFFFFFFu, hi = 0u;
    for (uint i = 0u; i < nq; i++) {
        uint a, b;
        span(t0 + i, a, b);
        lo = min(lo, a);
        hi = max(hi, b);
    }
    for (uint i = tid; i < QT * hd; i += WG) {
        uint qi = i / hd;
        qs[i] = qi < nq ? Q[((t0 + qi) * pc.n_head + h) * hd + i % hd] : 0.0;
    }
    uint qi = tid / DS, ds = tid % DS;
    uint my_lo = 0u, my_hi = 0u;
    if (qi < nq) span(t0 + qi, my_lo, my_hi);
    float acc[HPD];
    for (uint j = 0u; j < HPD; j++) acc[j] = 0.0;
    float m = -1.0 / 0.0, l = 0.0;
    for (uint c0 = lo; c0 < hi; c0 += KT) {
        uint cn = min(uint(KT), hi - c0);
        barrier();  // the previous tile's readers are done (and qs is written)
        for (uint i = tid; i < KT * hd; i += WG) {
            uint kk = i / hd, d = i % hd;
            bool inside = kk < cn;
            ks[i] = inside ? load_k(pc.kt, (c0 + kk) * krb, ko + d) : 0.0;
            vs[i] = inside ? load_v(pc.vt, (c0 + kk) * vrb, ko + d) : 0.0;
        }
        barrier();
        for (uint i = tid; i < QT * KT; i += WG) {
            uint a = i / KT, kk = i % KT, k = c0 + kk;
            float s = -1.0 / 0.0;
            uint alo = 0u, ahi = 0u;
            if (a < nq) span(t0 + a, alo, ahi);
            if (kk < cn && k >= alo && k < ahi) {
                float dp = 0.0;
                for (uint d = 0u; d < hd; d++) dp += qs[a * hd + d] * ks[kk * hd + d];
                s = dp * scale;
            }
            sc[i] = s;
        }
        barrier();
        float mt = -1.0 / 0.0;
        for (uint kk = 0u; kk < cn; kk++) mt = max(mt, sc[qi * KT + kk]);
        float m_new = max(m, mt);
        if (!isinf(m_new)) {  // else no key of this query yet
            float alpha = exp(m - m_new);
            l *= alpha;
            for (uint j = 0u; j < HPD; j++) acc[j] *= alpha;
            for (uint kk = 0u; kk < cn; kk++) {
                float p = exp(sc[qi * KT + kk] - m_new);
                l += p;
                for (uint j = 0u; j < HPD; j++) {
                    uint d = ds + j * DS;
                    if (d < hd) acc[j] += p * vs[kk * hd + d];
                }
            }
            m = m_new;
        }
    }
    if (qi >= nq) return;
#ifdef SINKS
    float sk = SK[h];
    float m_sk = max(m, sk);
    float c_sk = exp(m - m_sk);
    l = l * c_sk + exp(sk - m_sk);
    for (uint j = 0u; j < HPD; j++) acc[j] *= c_sk;
#endif
    float inv = 1.0 / l;
    uint qo = ((t0 + qi) * pc.n_head + h) * hd;
    for (uint j = 0u; j < HPD; j++) {
        uint d = ds + j * DS;
        if (d < hd) O[qo + d] = acc[j] * inv;
    }
}
