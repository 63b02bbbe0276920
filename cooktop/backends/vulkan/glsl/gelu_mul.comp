#version 450
// out = gelu(gate) * up, elementwise f32 [n] (GeGLU); GELU in ggml's tanh form (ggml_gelu_f32):
// 0.5 g (1 + tanh(sqrt(2/pi) g (1 + 0.044715 g^2))).
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
        O[i] = 0.5 * g * (1.0 + tanh(0.79788456080286535588 * g * (1.0 + 0.044715 * g * g))) * U[i];
    }
}
