#version 450
// The gated delta rule's gates (llama.cpp src/models/qwen35.cpp build_layer_attn_linear), over n = rows *
// n_head values: g = softplus(alpha + dt_bias[h]) * a[h] with softplus(x) = x > 20 ? x : log(1 + exp(x))
// (ggml-cpu/unary-ops.cpp op_softplus), beta = 1 / (1 + exp(-b)) (op_sigmoid). alpha, b, g, beta f32
// [rows, n_head] (g may be alpha, beta may be b); dt_bias, a f32 [n_head]. Grid-stride loop, 256-wide.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer AlBuf { float AL[]; };
layout(std430, binding = 1) readonly buffer BBuf { float B[]; };
layout(std430, binding = 2) readonly buffer DtBuf { float DT[]; };
layout(std430, binding = 3) readonly buffer ABuf { float A[]; };
layout(std430, binding = 4) buffer GBuf { float G[]; };
layout(std430, binding = 5) buffer BeBuf { float BETA[]; };
layout(push_constant) uniform PC { uint n; uint n_head; } pc;
#include "common.glsl"

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 256u;
    for (uint i = flat_group() * 256u + gl_LocalInvocationID.x; i < pc.n; i += stride) {
        uint h = i % pc.n_head;
        float x = AL[i] + DT[h];
        float sp = x > 20.0 ? x : log(1.0 + exp(x));
        BETA[i] = 1.0 / (1.0 + exp(-B[i]));
        G[i] = sp * A[h];
    }
}
