#version 450
// out = x * s, elementwise f32 [n] (ggml_scale; Granite's residual and logit multipliers; out may be x).
// Grid-stride loop, 256-wide workgroups.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer XBuf { float X[]; };
layout(std430, binding = 1) buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint n; uint s_bits; } pc;
#include "common.glsl"

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 256u;
    float s = uintBitsToFloat(pc.s_bits);
    for (uint i = flat_group() * 256u + gl_LocalInvocationID.x; i < pc.n; i += stride) O[i] = X[i] * s;
}
