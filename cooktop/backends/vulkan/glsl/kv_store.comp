#version 450
// cache[pos[i], :] = x[i, :] as the cache's type (push constant `type`, kv.glsl) stores it;
// cache [n_ctx, n_kv_dim] of GGML rows in a uint buffer, x f32 [n, n_kv_dim], pos int32 [n].
// One invocation per unit of a row: a value (f32), a pair of values (f16, bf16: one whole word)
// or a block of 32 (q8_0, q4_0: 34 / 18 bytes, whose words it shares with its neighbours, so each
// byte is put in with atomicAnd / atomicOr). f16 and bf16 round to nearest even in integer
// arithmetic (ggml's GGML_FP32_TO_FP16 and ggml_compute_fp32_to_bf16; GLSL's packHalf2x16 leaves
// the rounding to the device); q8_0 and q4_0 follow quantize_row_q8_0_ref / quantize_row_q4_0_ref
// (ggml-quants.c), `precise` keeping x * id + 8.5 two roundings (the divisions are as exact as the
// device's: correctly rounded on lavapipe). Rows with pos outside [0, n_ctx) are skipped (the
// engine refuses such positions with ContextOverflowError before they get here).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer CBuf { uint C[]; };
layout(std430, binding = 1) readonly buffer XBuf { float X[]; };
layout(std430, binding = 2) readonly buffer PBuf { int P[]; };
layout(push_constant) uniform PC { uint n; uint kv_dim; uint n_ctx; uint type; } pc;
#include "common.glsl"
#include "kv.glsl"

uint f16_rte(float f) {
    uint x = floatBitsToUint(f);
    uint sign = (x >> 16) & 0x8000u;
    uint e = (x >> 23) & 0xFFu;
    uint m = x & 0x7FFFFFu;
    if (e == 255u) return sign | 0x7C00u | (m != 0u ? 0x200u | (m >> 13) : 0u);
    int ee = int(e) - 112;
    if (ee >= 31) return sign | 0x7C00u;
    if (ee <= 0) {
        if (ee < -10) return sign;
        uint mm = m | 0x800000u;
        uint shift = uint(14 - ee);
        uint h = mm >> shift;
        uint rem = mm & ((1u << shift) - 1u);
        uint half_ = 1u << (shift - 1u);
        if (rem > half_ || (rem == half_ && (h & 1u) != 0u)) h++;
        return sign | h;
    }
    uint h = sign | (uint(ee) << 10) | (m >> 13);
    uint rem = m & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h++;
    return h;
}

uint bf16_rte(float f) {
    uint u = floatBitsToUint(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 64u;
    return (u + (0x7FFFu + ((u >> 16) & 1u))) >> 16;
}

void put_byte(uint off, uint v) {
    uint sh = (off & 3u) << 3;
    atomicAnd(C[off >> 2], ~(0xFFu << sh));
    atomicOr(C[off >> 2], (v & 0xFFu) << sh);
}

void main() {
    uint id = flat_group() * 64u + gl_LocalInvocationID.x;
    uint per = pc.type == KV_F32 ? pc.kv_dim : (pc.type == KV_F16 || pc.type == KV_BF16) ? pc.kv_dim / 2u
             : pc.kv_dim / 32u;
    uint row = id / per;
    if (row >= pc.n) return;
    int p = P[row];
    if (p < 0 || uint(p) >= pc.n_ctx) return;
    uint u = id % per;
    uint rb = uint(p) * kv_row_bytes(pc.type, pc.kv_dim);
    uint x0 = row * pc.kv_dim;
    if (pc.type == KV_F32) {
        C[(rb >> 2) + u] = floatBitsToUint(X[x0 + u]);
        return;
    }
    if (pc.type == KV_F16 || pc.type == KV_BF16) {
        float a = X[x0 + 2u * u], b = X[x0 + 2u * u + 1u];
        C[(rb >> 2) + u] = pc.type == KV_F16 ? f16_rte(a) | (f16_rte(b) << 16) : bf16_rte(a) | (bf16_rte(b) << 16);
        return;
    }
    uint xb = x0 + 32u * u;
    uint bo = rb + u * (pc.type == KV_Q8_0 ? 34u : 18u);
    if (pc.type == KV_Q8_0) {
        float amax = 0.0;
        for (uint i = 0u; i < 32u; i++) amax = max(amax, abs(X[xb + i]));
        precise float d = amax / 127.0;
        precise float idv = d != 0.0 ? 1.0 / d : 0.0;
        uint h = f16_rte(d);
        put_byte(bo, h);
        put_byte(bo + 1u, h >> 8);
        for (uint i = 0u; i < 32u; i++) {
            precise float v = X[xb + i] * idv;
            float t = trunc(v);  // roundf: halves away from zero (GLSL's round may pick either way)
            if (abs(v - t) >= 0.5) t += sign(v);
            put_byte(bo + 2u + i, uint(int(t)));
        }
        return;
    }
    float amax = 0.0, mx = 0.0;  // the value of largest magnitude, its sign kept (the first of equals)
    for (uint i = 0u; i < 32u; i++) {
        float v = X[xb + i];
        if (amax < abs(v)) { amax = abs(v); mx = v; }
    }
    precise float d = mx * -0.125;
    precise float idv = d != 0.0 ? 1.0 / d : 0.0;
    uint h = f16_rte(d);
    put_byte(bo, h);
    put_byte(bo + 1u, h >> 8);
    for (uint i = 0u; i < 16u; i++) {
        precise float a = X[xb + i] * idv + 8.5;
        precise float c = X[xb + 16u + i] * idv + 8.5;
        uint q0 = uint(min(15, int(a))), q1 = uint(min(15, int(c)));
        put_byte(bo + 2u + i, q0 | (q1 << 4));
    }
}
