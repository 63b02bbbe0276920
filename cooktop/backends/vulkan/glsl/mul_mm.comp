#version 450
// Tiled matrix-matrix product for many tokens (prompt processing, llama.cpp mul_mm):
// Y[t, r] = sum_k X[t, k] * W[r, k]; W [n_out, n_in] raw GGML blocks (TYPE_*),
// X f32 [n_tok, n_in], Y f32 [n_tok, n_out].
// A workgroup of 64 computes a tile of 32 rows x 32 tokens. For each 32-value
// unit along k, invocations 0..31 dequantize one weight row's unit into shared
// memory and 32..63 load the 32 tokens' x values, so every dequantized weight is
// reused by 32 tokens; then each invocation accumulates a 4 x 4 block in registers.
// Grid: ceil(n_tok / 32) * ceil(n_out / 32) workgroups (flat_group()).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer WBuf { uvec4 W4[]; };
layout(std430, binding = 1) readonly buffer XBuf { float X[]; };
layout(std430, binding = 2) writeonly buffer YBuf { float Y[]; };
layout(push_constant) uniform PC { uint n_in; uint n_out; uint n_tok; uint row_bytes; } pc;
#define HAS_WEIGHTS
#include "common.glsl"
#include "dequant.glsl"

// k-major tiles of vec4: Wv[k * 8 + r / 4] holds column k of rows r..r+3, Xv the same for
// tokens; the inner product then needs two 16-byte shared loads per 16 multiply-adds.
shared vec4 Wv[32 * 8];
shared vec4 Xv[32 * 8];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint n_rb = (pc.n_out + 31u) / 32u;
    uint g = flat_group();
    uint t0 = (g / n_rb) * 32u;
    uint r0 = (g % n_rb) * 32u;
    if (t0 >= pc.n_tok) return;  // uniform over the workgroup
    uint n_units = (pc.n_in + 31u) / 32u;  // a partial last unit only for F32 / F16 rows
    uint tr = tid & 7u;   // this invocation's rows 4*tr .. 4*tr+3
    uint tt = tid >> 3;   // and tokens 4*tt .. 4*tt+3
    vec4 acc[4] = vec4[4](vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0));  // acc[j][i]: token 4tt+j, row 4tr+i
    for (uint u = 0u; u < n_units; u++) {
        if (tid < 32u) {
            uint row = min(r0 + tid, pc.n_out - 1u);
            float v[32];
#ifdef FLOAT_TYPE
            if (u * 32u + 32u > pc.n_in) {
                for (uint i = 0u; i < 32u; i++) v[i] = u * 32u + i < pc.n_in ? value_at(row * pc.row_bytes, u * 32u + i) : 0.0;
            } else
#endif
            unit_values(row * pc.row_bytes, u, v);
            [[unroll]] for (uint i = 0u; i < 32u; i++) Wv[i * 8u + (tid >> 2)][tid & 3u] = v[i];
        } else {
            uint c = tid - 32u;
            [[unroll]] for (uint j = 0u; j < 32u; j++) {
                uint tok = min(t0 + j, pc.n_tok - 1u);
                Xv[c * 8u + (j >> 2)][j & 3u] = u * 32u + c < pc.n_in ? X[tok * pc.n_in + u * 32u + c] : 0.0;
            }
        }
        barrier();
        [[unroll]] for (uint k = 0u; k < 32u; k++) {
            vec4 a = Wv[k * 8u + tr];
            vec4 b = Xv[k * 8u + tt];
            acc[0] += a * b.x;
            acc[1] += a * b.y;
            acc[2] += a * b.z;
            acc[3] += a * b.w;
        }
        barrier();
    }
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        uint tok = t0 + 4u * tt + j;
        [[unroll]] for (uint i = 0u; i < 4u; i++) {
            uint row = r0 + 4u * tr + i;
            if (tok < pc.n_tok && row < pc.n_out) Y[tok * pc.n_out + row] = acc[j][i];
        }
    }
}
