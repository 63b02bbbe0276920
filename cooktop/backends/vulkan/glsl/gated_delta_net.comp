#version 450
// The gated delta rule with a carried state (ggml_gated_delta_net, ggml-cpu/ops.cpp
// ggml_compute_forward_gated_delta_net_one_chunk, one snapshot). q, k f32 [n, h_k * d]; v, out f32
// [n, h_v * d]; g, beta f32 [n, h_v]; state f32 [n_slots, h_v * d * d], slot s's row as m[h, j, i] (the
// state S_h[i][j], contiguous in i); slots int [n]; value head h reads key head (h / kdiv) % h_k (kdiv 1:
// tiled heads, ggml's h % h_k; kdiv h_v / h_k: repeat-interleaved heads, llama.cpp qwen3next.cpp).
// One invocation per (value head h, column j) (grid-stride, 64-wide workgroups) walks the rows in order:
// for each row it owns m[h, j, :] of the row's slot (no other invocation reads or writes it), so the rows
// of one slot see the state the rows before them left, and the dot products over i are its own:
//   m[j, :] *= exp(g); u = (v[j] - m[j, :] . k) * beta; m[j, :] += u * k; out[j] = (m[j, :] . q) * scale
#extension GL_GOOGLE_include_directive : require
#define WG 64
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer QBuf { float Q[]; };
layout(std430, binding = 1) readonly buffer KBuf { float K[]; };
layout(std430, binding = 2) readonly buffer VBuf { float V[]; };
layout(std430, binding = 3) readonly buffer GBuf { float G[]; };
layout(std430, binding = 4) readonly buffer BBuf { float BETA[]; };
layout(std430, binding = 5) buffer SBuf { float S[]; };
layout(std430, binding = 6) readonly buffer IBuf { int SL[]; };
layout(std430, binding = 7) writeonly buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint n; uint h_v; uint h_k; uint d; uint scale_bits; uint kdiv; } pc;
#include "common.glsl"

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * WG;
    float scale = uintBitsToFloat(pc.scale_bits);
    uint qk_w = pc.h_k * pc.d, v_w = pc.h_v * pc.d, dd = pc.d * pc.d;
    for (uint id = flat_group() * WG + gl_LocalInvocationID.x; id < v_w; id += stride) {  // h * d + j
        uint h = id / pc.d;
        uint key = ((h / pc.kdiv) % pc.h_k) * pc.d;
        for (uint r = 0u; r < pc.n; ++r) {
            uint m = uint(SL[r]) * pc.h_v * dd + id * pc.d;
            uint kr = r * qk_w + key;
            float decay = exp(G[r * pc.h_v + h]);
            float sk = 0.0;
            for (uint i = 0u; i < pc.d; ++i) {
                float s = S[m + i] * decay;
                S[m + i] = s;
                sk += s * K[kr + i];
            }
            float u = (V[r * v_w + id] - sk) * BETA[r * pc.h_v + h];
            float o = 0.0;
            for (uint i = 0u; i < pc.d; ++i) {
                float s = S[m + i] + K[kr + i] * u;
                S[m + i] = s;
                o += s * Q[kr + i];
            }
            O[r * v_w + id] = o * scale;
        }
    }
}
