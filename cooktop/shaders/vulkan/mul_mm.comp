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
layout(std430, binding = 0) readonly buffer WBuf { uint W[]; };
layout(std430, binding = 1) readonly buffer XBuf { float X[]; };
layout(std430, binding = 2) writeonly buffer YBuf { float Y[]; };
layout(push_constant) uniform PC { uint n_in; uint n_out; uint n_tok; uint row_bytes; } pc;
#define HAS_WEIGHTS
#include "common.glsl"
#include "dequant.glsl"

shared float Ws[32 * 33];  // [row][k], padded against bank conflicts
shared float Xs[32 * 33];  // [token][k]

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint n_rb = (pc.n_out + 31u) / 32u;
    uint g = flat_group();
    uint t0 = (g / n_rb) * 32u;
    uint r0 = (g % n_rb) * 32u;
    if (t0 >= pc.n_tok) return;  // uniform over the workgroup
    uint n_units = pc.n_in / 32u;
    uint tr = (tid & 7u) * 4u;   // this invocation's 4 rows
    uint tt = (tid >> 3) * 4u;   // and 4 tokens
    float acc[16];
    for (uint i = 0u; i < 16u; i++) acc[i] = 0.0;
    for (uint u = 0u; u < n_units; u++) {
        if (tid < 32u) {
            uint row = min(r0 + tid, pc.n_out - 1u);
            float v[32];
            unit_values(row * pc.row_bytes, u, v);
            for (uint i = 0u; i < 32u; i++) Ws[tid * 33u + i] = v[i];
        } else {
            uint c = tid - 32u;
            for (uint j = 0u; j < 32u; j++) {
                uint tok = min(t0 + j, pc.n_tok - 1u);
                Xs[j * 33u + c] = X[tok * pc.n_in + u * 32u + c];
            }
        }
        barrier();
        for (uint k = 0u; k < 32u; k++) {
            float a0 = Ws[(tr + 0u) * 33u + k], a1 = Ws[(tr + 1u) * 33u + k];
            float a2 = Ws[(tr + 2u) * 33u + k], a3 = Ws[(tr + 3u) * 33u + k];
            for (uint j = 0u; j < 4u; j++) {
                float b = Xs[(tt + j) * 33u + k];
                acc[j * 4u + 0u] += a0 * b;
                acc[j * 4u + 1u] += a1 * b;
                acc[j * 4u + 2u] += a2 * b;
                acc[j * 4u + 3u] += a3 * b;
            }
        }
        barrier();
    }
    for (uint j = 0u; j < 4u; j++) {
        uint tok = t0 + tt + j;
        for (uint i = 0u; i < 4u; i++) {
            uint row = r0 + tr + i;
            if (tok < pc.n_tok && row < pc.n_out) Y[tok * pc.n_out + row] = acc[j * 4u + i];
        }
    }
}
