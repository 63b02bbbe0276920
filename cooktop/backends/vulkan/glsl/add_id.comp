#version 450
// ggml_add_id: O[r, j*m + c] = X[r, j*m + c] + B[ids[r, j], c]; X, O f32 [n, k * m] (O may be X),
// B f32 [n_expert, m], ids int32 [n, k] clamped. Grid-stride loop, 256-wide workgroups.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer XBuf { float X[]; };
layout(std430, binding = 1) readonly buffer BBuf { float B[]; };
layout(std430, binding = 2) readonly buffer IdBuf { int ids[]; };
layout(std430, binding = 3) buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint total; uint k; uint m; uint n_expert; } pc;
#include "common.glsl"

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 256u;
    for (uint i = flat_group() * 256u + gl_LocalInvocationID.x; i < pc.total; i += stride) {
        uint slot = i / pc.m;  // r * k + j
        uint e = uint(clamp(ids[slot], 0, int(pc.n_expert) - 1));
        O[i] = X[i] + B[e * pc.m + i % pc.m];
    }
}
