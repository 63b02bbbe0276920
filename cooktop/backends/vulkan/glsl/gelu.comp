#version 450
// The GELUs, elementwise f32 [n] (out may be x); grid-stride loop, 256-wide workgroups. One of:
//   (default)   ggml_gelu, tanh form (ggml-cpu/vec.h ggml_gelu_f32): 0.5 x (1 + tanh(u)),
//               u = sqrt(2/pi) x (1 + 0.044715 x^2), computed as x / (1 + exp(-2 u)) (the same function:
//               0.5 (1 + tanh(u)) = sigmoid(2 u)), which keeps its precision where 1 + tanh(u) cancels
//   GELU_ERF    ggml_gelu_erf (ggml_vec_gelu_erf_f32): 0.5 x (1 + erf(x / sqrt(2))); GLSL has no erf:
//               Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7), as ggml-vulkan's gelu_erf.comp
//   GELU_QUICK  ggml_gelu_quick (ggml_gelu_quick_f32, GELU_QUICK_COEF -1.702): x / (1 + exp(-1.702 x))
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer XBuf { float X[]; };
layout(std430, binding = 1) buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint n; } pc;
#include "common.glsl"

float act(float x) {
#if defined(GELU_ERF)
    float a = abs(x) * 0.70710678118654752440;
    float t = 1.0 / (1.0 + 0.3275911 * a);
    float poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    float e = 1.0 - poly * exp(-a * a);
    return 0.5 * x * (1.0 + (x < 0.0 ? -e : e));
#elif defined(GELU_QUICK)
    return x / (1.0 + exp(-1.702 * x));
#else
    return x / (1.0 + exp(-1.5957691216057307118 * x * (1.0 + 0.044715 * x * x)));
#endif
}

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 256u;
    for (uint i = flat_group() * 256u + gl_LocalInvocationID.x; i < pc.n; i += stride) O[i] = act(X[i]);
}
