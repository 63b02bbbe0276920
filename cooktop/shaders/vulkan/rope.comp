#version 450
// Rotary position embedding (ggml_rope_ext, ext_factor 0, attn_factor 1).
// x, out f32 [n, n_heads * head_dim]; pos int32 [n]. For pair i < n_rot/2:
// theta = pos * freq_scale * freq_base^(-2i/n_rot); mode 0 rotates (x[2i], x[2i+1]),
// mode 2 (NeoX) rotates (x[i], x[i + n_rot/2]); dims >= n_rot are copied.
// One invocation per pair slot: n * n_heads * head_dim/2 invocations, WG 64.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer XBuf { float X[]; };
layout(std430, binding = 1) readonly buffer PBuf { int P[]; };
layout(std430, binding = 2) buffer OBuf { float O[]; };
layout(push_constant) uniform PC {
    uint n; uint n_heads; uint head_dim; uint n_rot; uint base_bits; uint scale_bits; uint mode;
} pc;
#include "common.glsl"

void main() {
    uint half_hd = pc.head_dim / 2u;
    uint id = flat_group() * 64u + gl_LocalInvocationID.x;
    uint i = id % half_hd;
    uint t = id / half_hd;
    uint head = t % pc.n_heads;
    uint row = t / pc.n_heads;
    if (row >= pc.n) return;
    uint o = row * pc.n_heads * pc.head_dim + head * pc.head_dim;
    uint half_rot = pc.n_rot / 2u;
    if (i >= half_rot) {  // pass-through of the dimensions past n_rot
        uint d = pc.n_rot + 2u * (i - half_rot);
        O[o + d] = X[o + d];
        O[o + d + 1u] = X[o + d + 1u];
        return;
    }
    float inv = pow(uintBitsToFloat(pc.base_bits), -2.0 * float(i) / float(pc.n_rot));
    float theta = float(P[row]) * uintBitsToFloat(pc.scale_bits) * inv;
    // reduce to [-pi, pi] (Cody-Waite, 2*pi split in two floats): GLSL sin/cos are only
    // specified to 2^-11 absolute error inside that range
    float k = floor(theta * 0.15915494 + 0.5);
    theta = (theta - k * 6.28125) - k * 1.9353072e-3;
    float c = cos(theta), s = sin(theta);
    uint a = pc.mode == 2u ? i : 2u * i;
    uint b = pc.mode == 2u ? i + half_rot : 2u * i + 1u;
    float xa = X[o + a], xb = X[o + b];
    O[o + a] = xa * c - xb * s;
    O[o + b] = xa * s + xb * c;
}
