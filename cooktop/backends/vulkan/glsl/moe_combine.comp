#version 450
// O[r, c] = sum_j Wt[r, j] * Y[r, j*m + c], in slot order (llama.cpp build_moe_ffn: the weighted
// expert outputs added view by view); Y f32 [n, k * m], Wt f32 [n, k], O f32 [n, m].
// Grid-stride loop, 256-wide workgroups.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer YBuf { float Y[]; };
layout(std430, binding = 1) readonly buffer WBuf { float Wt[]; };
layout(std430, binding = 2) writeonly buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint total; uint k; uint m; } pc;
#include "common.glsl"

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 256u;
    for (uint i = flat_group() * 256u + gl_LocalInvocationID.x; i < pc.total; i += stride) {
        uint r = i / pc.m, c = i % pc.m;
        uint y0 = r * pc.k * pc.m + c;
        float acc = Y[y0] * Wt[r * pc.k];
        for (uint j = 1u; j < pc.k; j++) acc += Y[y0 + j * pc.m] * Wt[r * pc.k + j];
        O[i] = acc;
    }
}
