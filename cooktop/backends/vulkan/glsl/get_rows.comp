#version 450
// out[i, :] = dequantize(table[ids[i], :]) (ggml_get_rows): table [n_rows, n] raw
// GGML blocks (TYPE_*), ids int32 [k], out f32 [k, n].
// Quantized tables: one invocation per 32-value unit, grid k * ceil(n / 32 / 32).
// F32 / F16 tables (any n): one invocation per value, grid k * ceil(n / 32).
// Workgroups of 32. Ids outside [0, n_rows) are clamped (never read out of bounds).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 32) in;
layout(std430, binding = 0) readonly buffer WBuf { uvec4 W4[]; };
layout(std430, binding = 1) readonly buffer IdBuf { int ids[]; };
layout(std430, binding = 2) writeonly buffer OBuf { float O[]; };
layout(push_constant) uniform PC { uint n; uint n_ids; uint row_bytes; uint n_rows; } pc;
#define HAS_WEIGHTS
#include "common.glsl"
#include "dequant.glsl"

void main() {
#if defined(TYPE_F32) || defined(TYPE_F16)
    uint n_items = pc.n;
#else
    uint n_items = pc.n / 32u;
#endif
    uint ug = (n_items + 31u) / 32u;
    uint g = flat_group();
    uint i = g / ug;
    uint u = (g % ug) * 32u + gl_LocalInvocationID.x;
    if (i >= pc.n_ids || u >= n_items) return;
    uint row = uint(clamp(ids[i], 0, int(pc.n_rows) - 1));
#if defined(TYPE_F32)
    O[i * pc.n + u] = uintBitsToFloat(w_u32a(row * pc.row_bytes + 4u * u));
#elif defined(TYPE_F16)
    O[i * pc.n + u] = w_f16(row * pc.row_bytes + 2u * u);
#else
    float v[32];
    unit_values(row * pc.row_bytes, u, v);
    uint o = i * pc.n + u * 32u;
    for (uint k = 0u; k < 32u; k++) O[o + k] = v[k];
#endif
}
