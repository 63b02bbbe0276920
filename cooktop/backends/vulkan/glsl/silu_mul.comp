#version 450
// out = silu(gate) * up = gate / (1 + exp(-gate)) * up, elementwise f32 [n] (SwiGLU).
// Grid-stride loop over n with 256-wide workgroups.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer GBuf { float G[]; };
layout(std430, binding = 1) readonly buffer UBuf { float U[]; };
layout(std430, binding = 2) buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint n; } pc;
#include "common.glsl"

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 256u;
    for (uint i = flat_group() * 256u + gl_LocalInvocationID.x; i < pc.n; i += stride) {
        float g = G[i];
        O[i] = g / (1.0 + exp(-g)) * U[i];
    }
}
