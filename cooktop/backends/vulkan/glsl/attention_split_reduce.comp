#version 450
// Reduce of split-K attention (attention.comp with SPLIT; llama.cpp ggml-vulkan's
// flash_attn_split_k_reduce.comp): for each (row i, head h) the n_split partials
// (acc[head_dim], m, l) at rows (i * n_head + h) * n_split + s of PT [*, head_dim + 2] are
// combined: M = max m_s, l = sum l_s exp(m_s - M), acc = sum acc_s exp(m_s - M); with SINKS the
// head's sink logit joins the denominator (llama.cpp ggml_soft_max_add_sinks); out = acc / l.
// out f32 [n, n_head * head_dim]. One workgroup of 64 per (row, head); invocation tid owns
// dims tid, tid + 64, ... (head_dim <= 256). Every row has at least one key, so some m_s is finite.
#extension GL_GOOGLE_include_directive : require
#define WG 64
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer PBuf { float PT[]; };
layout(std430, binding = 1) writeonly buffer OBuf { float O[]; };
#ifdef SINKS
layout(std430, binding = 2) readonly buffer SkBuf { float SK[]; };
#endif
layout(push_constant) uniform PC {
    uint n; uint n_head; uint head_dim; uint n_split;
} pc;
#include "common.glsl"

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint g = flat_group();
    uint h = g % pc.n_head;
    uint row = g / pc.n_head;
    if (row >= pc.n) return;
    uint hd = pc.head_dim;
    uint w = hd + 2u;
    uint p0 = (row * pc.n_head + h) * pc.n_split * w;
    float M = -1.0 / 0.0;
    for (uint s = 0u; s < pc.n_split; s++) M = max(M, PT[p0 + s * w + hd]);
    float l = 0.0;
    float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
    for (uint s = 0u; s < pc.n_split; s++) {
        uint ps = p0 + s * w;
        float ls = PT[ps + hd + 1u];
        if (ls == 0.0) continue;  // an empty split (m = -inf)
        float c = exp(PT[ps + hd] - M);
        l += ls * c;
        for (uint a = 0u; a < 4u; a++) {
            uint d = tid + a * WG;
            if (d < hd) acc[a] += PT[ps + d] * c;
        }
    }
#ifdef SINKS
    float sk = SK[h];
    float m_sk = max(M, sk);
    float c_sk = exp(M - m_sk);
    l = l * c_sk + exp(sk - m_sk);
    for (uint a = 0u; a < 4u; a++) acc[a] *= c_sk;
#endif
    float inv = 1.0 / l;
    uint qo = row * pc.n_head * hd + h * hd;
    for (uint a = 0u; a < 4u; a++) {
        uint d = tid + a * WG;
        if (d < hd) O[qo + d] = acc[a] * inv;
    }
}
