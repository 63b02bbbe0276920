#version 450
// Rotary position embedding, ggml_rope_ext (ggml-cpu ops.cpp rope_yarn).
// x, out f32 [n, n_heads * head_dim]; pos int32 [n]; FF f32 [>= n_rot/2] frequency factors
// (read only when has_ff; a 4-value dummy is bound otherwise). For pair i < n_rot/2:
// t_extrap = pos * freq_base^(-2i/n_rot) / ff[i], theta = freq_scale * t_extrap; when
// ext_factor != 0 (YaRN) theta is mixed with t_extrap along the ramp over (corr0, corr1);
// cos and sin are scaled by mscale (host-computed). mode 0 rotates (x[2i], x[2i+1]),
// mode 2 (NeoX) rotates (x[i], x[i + n_rot/2]); dims >= n_rot are copied.
// One invocation per pair slot: n * n_heads * head_dim/2 invocations, WG 64.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer XBuf { float X[]; };
layout(std430, binding = 1) readonly buffer PBuf { int P[]; };
layout(std430, binding = 2) buffer OBuf { float O[]; };
layout(std430, binding = 3) readonly buffer FBuf { float FF[]; };
layout(push_constant) uniform PC {
    uint n; uint n_heads; uint head_dim; uint n_rot; uint base_bits; uint scale_bits; uint mode;
    uint has_ff; uint ext_bits; uint mscale_bits; uint corr0_bits; uint corr1_bits;
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
    float t_extrap = float(P[row]) * inv;
    if (pc.has_ff != 0u) t_extrap /= FF[i];
    float theta = uintBitsToFloat(pc.scale_bits) * t_extrap;
    float ext = uintBitsToFloat(pc.ext_bits);
    if (ext != 0.0) {
        float c0 = uintBitsToFloat(pc.corr0_bits), c1 = uintBitsToFloat(pc.corr1_bits);
        float ramp = (1.0 - clamp((float(i) - c0) / max(0.001, c1 - c0), 0.0, 1.0)) * ext;
        theta = theta * (1.0 - ramp) + t_extrap * ramp;
    }
    // reduce to [-pi, pi] (Cody-Waite, 2*pi split in two floats): GLSL sin/cos are only
    // specified to 2^-11 absolute error inside that range
    float k = floor(theta * 0.15915494 + 0.5);
    theta = (theta - k * 6.28125) - k * 1.9353072e-3;
    float mscale = uintBitsToFloat(pc.mscale_bits);
    float c = cos(theta) * mscale, s = sin(theta) * mscale;
    uint a = pc.mode == 2u ? i : 2u * i;
    uint b = pc.mode == 2u ? i + half_rot : 2u * i + 1u;
    float xa = X[o + a], xb = X[o + b];
    O[o + a] = xa * c - xb * s;
    O[o + b] = xa * s + xb * c;
}
