#version 450
// Causal multi-head attention over the KV cache with GQA (llama.cpp grouping):
// query row i of head h attends to cache rows k0..pos[i] of kv head h / (n_head / n_head_kv),
// k0 = S0[i] when has_start (rows of several sequences sharing one cache), else 0;
// window > 0 (sliding window, llama.cpp's standard SWA) keeps rows pos[i]-window < j <= pos[i];
// out = softmax(q k^T * scale) v, softmax in float32.
// q, out f32 [n, n_head * head_dim]; k, v [n_cells, n_head_kv * head_dim] of the cache types kt and vt
// (push constants; kv.glsl: f32, f16, bf16, q8_0, q4_0), read as stored; pos, S0 int32 [n].
// One workgroup of 64 per (row, head). Keys are processed in chunks of KC: scores of a
// chunk go to shared memory, then an online softmax (running max and sum, rescaling
// the accumulators; flash-attention style) adds the chunk's weighted values. Each
// invocation owns output dims tid, tid + 64, ... (head_dim <= 256) and adds every key in order, as
// attention_tiled.comp does for its query: a row decoded here and the same row of a prompt are the
// same bits while the row's running max stays that of its first 8 keys (the tiled shader's key tile).
// SPLIT (split-K, "flash decoding"; llama.cpp ggml-vulkan's split_k): n_split workgroups per
// (row, head), split s taking the s-th of n_split equal parts (at least SPLIT_MIN keys each) of the
// row's keys k0..pos[i]; each writes its partial (acc[head_dim] unnormalised, running max m, sum l)
// to row ((i * n_head + h) * n_split + s) of O read as [*, head_dim + 2]; a split past the row's keys
// writes m = -inf, l = 0. attention_split_reduce.comp combines them (and folds in the sinks).
#extension GL_GOOGLE_include_directive : require
#define WG 64
#define KC 256
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer QBuf { float Q[]; };
layout(std430, binding = 1) readonly buffer KBuf { uint K[]; };
layout(std430, binding = 2) readonly buffer VBuf { uint V[]; };
layout(std430, binding = 3) readonly buffer PBuf { int P[]; };
layout(std430, binding = 4) readonly buffer SBuf { int S0[]; };
layout(std430, binding = 5) writeonly buffer OBuf { float O[]; };
#if defined(SINKS) && !defined(SPLIT)
// attention_sinks (gpt-oss): one extra logit per head in each softmax denominator, no value
// (llama.cpp ggml_soft_max_add_sinks); folded into the running max and sum after the last chunk
layout(std430, binding = 6) readonly buffer SkBuf { float SK[]; };
#endif
layout(push_constant) uniform PC {
    uint n; uint n_head; uint n_head_kv; uint head_dim; uint n_ctx; uint scale_bits; uint window; uint has_start;
    uint kt; uint vt;
#ifdef SPLIT
    uint n_split;
#endif
} pc;
#define SPLIT_MIN 64u
#include "common.glsl"
#include "kv.glsl"
KV_LOADER(load_k, K)
KV_LOADER(load_v, V)

shared float qs[256];
shared float S[KC];
shared float red[WG];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint g = flat_group();
#ifdef SPLIT
    uint split = g % pc.n_split;
    g /= pc.n_split;
#endif
    uint h = g % pc.n_head;
    uint row = g / pc.n_head;
    if (row >= pc.n) return;  // uniform over the workgroup
    uint hd = pc.head_dim;
    uint hkv = h / (pc.n_head / pc.n_head_kv);
    uint qo = row * pc.n_head * hd + h * hd;
    uint kv_dim = pc.n_head_kv * hd;
    uint krb = kv_row_bytes(pc.kt, kv_dim), vrb = kv_row_bytes(pc.vt, kv_dim);
    uint ko = hkv * hd;
    float scale = uintBitsToFloat(pc.scale_bits);
    int p = P[row];
    uint n_kv = uint(clamp(p + 1, 1, int(pc.n_ctx)));
    int s0 = pc.has_start != 0u ? clamp(S0[row], 0, int(n_kv) - 1) : 0;
    uint k0 = uint(max(s0, pc.window > 0u ? int(n_kv) - int(pc.window) : 0));
#ifdef SPLIT
    uint per = max((n_kv - k0 + pc.n_split - 1u) / pc.n_split, SPLIT_MIN);
    uint kb = min(k0 + split * per, n_kv);
    uint ke = min(kb + per, n_kv);
#else
    uint kb = k0, ke = n_kv;
#endif
    for (uint d = tid; d < hd; d += WG) qs[d] = Q[qo + d];
    barrier();

    // weighted V: each lane owns dims tid, tid + WG, ... and adds every key in order (not lanes in
    // groups over the keys: that sums in another order than a prompt's attention_tiled.comp)
    uint na = (hd + WG - 1u) / WG;
    // four scalars, not an array: lavapipe keeps a dynamically indexed array in memory
    float acc0 = 0.0, acc1 = 0.0, acc2 = 0.0, acc3 = 0.0;
    float m = -1.0 / 0.0;  // running max (-inf)
    float l = 0.0;         // running sum of exp
    for (uint c0 = kb; c0 < ke; c0 += KC) {
        uint cn = min(uint(KC), ke - c0);
        float lmax = -1.0 / 0.0;
        for (uint j = tid; j < cn; j += WG) {
            uint kr = (c0 + j) * krb;
            float s = 0.0;
            for (uint d = 0u; d < hd; d++) s += qs[d] * load_k(pc.kt, kr, ko + d);
            s *= scale;
            S[j] = s;
            lmax = max(lmax, s);
        }
        red[tid] = lmax;
        barrier();
        for (uint st = WG / 2u; st > 0u; st >>= 1) {
            if (tid < st) red[tid] = max(red[tid], red[tid + st]);
            barrier();
        }
        float m_new = max(m, red[0]);
        // each score's exp once, by the invocation that computed it (not once per invocation)
        for (uint j = tid; j < cn; j += WG) S[j] = exp(S[j] - m_new);
        barrier();
        float corr = exp(m - m_new);
        l *= corr;
        acc0 *= corr; acc1 *= corr; acc2 *= corr; acc3 *= corr;
        for (uint j = 0u; j < cn; j++) {
            float pj = S[j];
            l += pj;
            uint vr = (c0 + j) * vrb;
            if (tid < hd) acc0 += pj * load_v(pc.vt, vr, ko + tid);
            if (na > 1u) {
                if (tid + WG < hd) acc1 += pj * load_v(pc.vt, vr, ko + tid + WG);
                if (tid + 2u * WG < hd) acc2 += pj * load_v(pc.vt, vr, ko + tid + 2u * WG);
                if (tid + 3u * WG < hd) acc3 += pj * load_v(pc.vt, vr, ko + tid + 3u * WG);
            }
        }
        m = m_new;
        barrier();  // S and red are reused by the next chunk
    }
#ifdef SPLIT
    uint po = ((row * pc.n_head + h) * pc.n_split + split) * (hd + 2u);
    if (tid < hd) O[po + tid] = acc0;
    if (tid + WG < hd) O[po + tid + WG] = acc1;
    if (tid + 2u * WG < hd) O[po + tid + 2u * WG] = acc2;
    if (tid + 3u * WG < hd) O[po + tid + 3u * WG] = acc3;
    if (tid == 0u) {
        O[po + hd] = m;
        O[po + hd + 1u] = l;
    }
    return;
#endif
#ifdef SINKS
    float sk = SK[h];
    float m_sk = max(m, sk);
    float c_sk = exp(m - m_sk);
    l = l * c_sk + exp(sk - m_sk);
    acc0 *= c_sk; acc1 *= c_sk; acc2 *= c_sk; acc3 *= c_sk;
#endif
    float inv = 1.0 / l;
    if (tid < hd) O[qo + tid] = acc0 * inv;
    if (tid + WG < hd) O[qo + tid + WG] = acc1 * inv;
    if (tid + 2u * WG < hd) O[qo + tid + 2u * WG] = acc2 * inv;
    if (tid + 3u * WG < hd) O[qo + tid + 3u * WG] = acc3 * inv;
}
