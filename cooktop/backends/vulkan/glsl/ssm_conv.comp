#version 450
// Causal depthwise convolution with a carried state (ggml_ssm_conv, ggml-cpu/ops.cpp ssm_conv_f32; the
// state prepended and written back as llama.cpp src/models/lfm2.cpp does). x, out f32 [n, c]; w f32 [c, k]
// (k taps per channel); state f32 [n_slots, (k - 1) * c], slot s's row as [k - 1, c], oldest first;
// slots int [n]. One invocation per channel (grid-stride) walks the rows in order, so rows of one slot
// see the inputs of the rows before them; the taps are summed in order in float, as ggml's.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer XBuf { float X[]; };
layout(std430, binding = 1) buffer SBuf { float S[]; };
layout(std430, binding = 2) readonly buffer WBuf { float W[]; };
layout(std430, binding = 3) readonly buffer IBuf { int SL[]; };
layout(std430, binding = 4) writeonly buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint n; uint c; uint k; } pc;
#include "common.glsl"

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 256u;
    for (uint ch = flat_group() * 256u + gl_LocalInvocationID.x; ch < pc.c; ch += stride) {
        for (uint i = 0u; i < pc.n; ++i) {
            uint base = uint(SL[i]) * (pc.k - 1u) * pc.c + ch;
            float xi = X[i * pc.c + ch];
            float sum = 0.0;
            for (uint t = 0u; t + 1u < pc.k; ++t) sum += S[base + t * pc.c] * W[ch * pc.k + t];
            sum += xi * W[ch * pc.k + pc.k - 1u];
            for (uint t = 0u; t + 2u < pc.k; ++t) S[base + t * pc.c] = S[base + (t + 1u) * pc.c];
            S[base + (pc.k - 2u) * pc.c] = xi;
            O[i * pc.c + ch] = sum;
        }
    }
}
