// Dequantization of one 32-value "unit" of a weight row, per GGML type.
//
// Every supported type splits a row into units of 32 consecutive values:
// one block of F32/F16 (32 values), Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, or one
// 32-value sub-block of the 256-value super-blocks of Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
// unit_values(row_off, u, v) writes the 32 float values of unit `u` of the
// row that starts at byte `row_off` into v[0..31].
//
// Block layouts and formulas: ggml-common.h (block_q4_0 ... block_q6_K, block_mxfp4) and
// ggml-quants.c dequantize_row_*; checked against gguf.quants.dequantize by
// tests/test_vulkan.py and the parity tests.
//
// Needs common.glsl with HAS_WEIGHTS, and exactly one TYPE_* define.
#extension GL_EXT_control_flow_attributes : require

#if defined(TYPE_F32)
void unit_values(uint row_off, uint u, out float v[32]) {
    uint off = row_off + u * 128u;
    if ((off & 15u) == 0u) {  // rows of a multiple of 4 values: 16-byte loads
        [[unroll]] for (uint i = 0u; i < 8u; i++) {
            vec4 f = uintBitsToFloat(w_u128a(off + 16u * i));
            v[4u * i] = f.x; v[4u * i + 1u] = f.y; v[4u * i + 2u] = f.z; v[4u * i + 3u] = f.w;
        }
    } else {
        [[unroll]] for (uint i = 0u; i < 32u; i++) v[i] = uintBitsToFloat(w_u32a(off + 4u * i));
    }
}
// One value k of a float row, for rows whose length is not a multiple of 32.
#define FLOAT_TYPE 1
float value_at(uint row_off, uint k) {
    return uintBitsToFloat(w_u32a(row_off + 4u * k));
}
#elif defined(TYPE_F16)
#define FLOAT_TYPE 1
float value_at(uint row_off, uint k) {
    return w_f16(row_off + 2u * k);
}
void unit_values(uint row_off, uint u, out float v[32]) {
    uint off = row_off + u * 64u;
    if ((off & 15u) == 0u) {  // rows of a multiple of 8 values: 16-byte loads
        [[unroll]] for (uint i = 0u; i < 4u; i++) {
            uvec4 q = w_u128a(off + 16u * i);
            vec2 a = unpackHalf2x16(q.x), b = unpackHalf2x16(q.y), c = unpackHalf2x16(q.z), d = unpackHalf2x16(q.w);
            v[8u * i] = a.x; v[8u * i + 1u] = a.y; v[8u * i + 2u] = b.x; v[8u * i + 3u] = b.y;
            v[8u * i + 4u] = c.x; v[8u * i + 5u] = c.y; v[8u * i + 6u] = d.x; v[8u * i + 7u] = d.y;
        }
    } else {
        [[unroll]] for (uint i = 0u; i < 16u; i++) {
            vec2 h = unpackHalf2x16(w_u32(off + 4u * i));  // rows of odd length are only 2-byte aligned
            v[2u * i] = h.x;
            v[2u * i + 1u] = h.y;
        }
    }
}
#elif defined(TYPE_Q8_0) && defined(PACKED16)
// block_q8_0 as 17 16-bit words: d, then qs[2i] | qs[2i+1] << 8
void unit_values(uint row_off, uint u, out float v[32]) {
    uint w = (row_off + u * 34u) >> 1;
    float d = unpackHalf2x16(uint(W16[w])).x;
    [[unroll]] for (uint j = 0u; j < 16u; j++) {
        uint q = uint(W16[w + 1u + j]);
        v[2u * j] = d * float(int(q << 24) >> 24);
        v[2u * j + 1u] = d * float(int(q << 16) >> 24);
    }
}
#elif defined(TYPE_Q8_0)
// block_q8_0 (34 bytes): f16 d; int8 qs[32]. x = d * qs[i]
void unit_values(uint row_off, uint u, out float v[32]) {
    uint off = row_off + u * 34u;
    float d = w_f16(off);
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        uint q = w_u32(off + 2u + 4u * j);
        [[unroll]] for (uint k = 0u; k < 4u; k++) v[4u * j + k] = d * float(int(q << (24u - 8u * k)) >> 24);
    }
}
#elif defined(TYPE_Q4_0) && defined(PACKED16)
// block_q4_0 as 9 16-bit words: d, then qs[2i] | qs[2i+1] << 8
void unit_values(uint row_off, uint u, out float v[32]) {
    uint w = (row_off + u * 18u) >> 1;
    float d = unpackHalf2x16(uint(W16[w])).x;
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        uint q = uint(W16[w + 1u + j]);
        [[unroll]] for (uint k = 0u; k < 2u; k++) {
            uint b = (q >> (8u * k)) & 0xFFu;
            v[2u * j + k] = d * (float(b & 15u) - 8.0);
            v[2u * j + k + 16u] = d * (float(b >> 4) - 8.0);
        }
    }
}
#elif defined(TYPE_Q4_0)
// block_q4_0 (18 bytes): f16 d; uint8 qs[16]. x[j] = d*((qs[j]&15)-8), x[j+16] = d*((qs[j]>>4)-8)
void unit_values(uint row_off, uint u, out float v[32]) {
    uint off = row_off + u * 18u;
    float d = w_f16(off);
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        uint q = w_u32(off + 2u + 4u * j);
        [[unroll]] for (uint k = 0u; k < 4u; k++) {
            uint b = (q >> (8u * k)) & 0xFFu;
            v[4u * j + k] = d * (float(b & 15u) - 8.0);
            v[4u * j + k + 16u] = d * (float(b >> 4) - 8.0);
        }
    }
}
#elif defined(TYPE_Q4_1)
// block_q4_1 (20 bytes): f16 d, m; uint8 qs[16]. x = d*q + m
void unit_values(uint row_off, uint u, out float v[32]) {
    uint off = row_off + u * 20u;
    vec2 dm = unpackHalf2x16(w_u32a(off));  // 20-byte blocks: every field 4-byte aligned
    float d = dm.x;
    float m = dm.y;
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        uint q = w_u32a(off + 4u + 4u * j);
        [[unroll]] for (uint k = 0u; k < 4u; k++) {
            uint b = (q >> (8u * k)) & 0xFFu;
            v[4u * j + k] = d * float(b & 15u) + m;
            v[4u * j + k + 16u] = d * float(b >> 4) + m;
        }
    }
}
#elif defined(TYPE_Q5_0)
// block_q5_0 (22 bytes): f16 d; uint8 qh[4]; uint8 qs[16].
// x[j] = d*((qs[j]&15 | bit j of qh << 4) - 16), x[j+16] = d*((qs[j]>>4 | bit j+16 of qh << 4) - 16)
void unit_values(uint row_off, uint u, out float v[32]) {
    uint off = row_off + u * 22u;
    float d = w_f16(off);
    uint qh = w_u32(off + 2u);
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        uint q = w_u32(off + 6u + 4u * j);
        [[unroll]] for (uint k = 0u; k < 4u; k++) {
            uint l = 4u * j + k;
            uint b = (q >> (8u * k)) & 0xFFu;
            v[l] = d * (float((b & 15u) | (((qh >> l) & 1u) << 4)) - 16.0);
            v[l + 16u] = d * (float((b >> 4) | (((qh >> (l + 16u)) & 1u) << 4)) - 16.0);
        }
    }
}
#elif defined(TYPE_Q5_1)
// block_q5_1 (24 bytes): f16 d, m; uint8 qh[4]; uint8 qs[16]. x = d*q + m, q as Q5_0 without -16
void unit_values(uint row_off, uint u, out float v[32]) {
    uint off = row_off + u * 24u;
    vec2 dm = unpackHalf2x16(w_u32a(off));  // 24-byte blocks: every field 4-byte aligned
    float d = dm.x;
    float m = dm.y;
    uint qh = w_u32a(off + 4u);
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        uint q = w_u32a(off + 8u + 4u * j);
        [[unroll]] for (uint k = 0u; k < 4u; k++) {
            uint l = 4u * j + k;
            uint b = (q >> (8u * k)) & 0xFFu;
            v[l] = d * float((b & 15u) | (((qh >> l) & 1u) << 4)) + m;
            v[l + 16u] = d * float((b >> 4) | (((qh >> (l + 16u)) & 1u) << 4)) + m;
        }
    }
}
#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
// get_scale_min_k4 of ggml-quants.c: 6-bit scale and min of sub-block s from scales[12],
// given as three little-endian words s0 = scales[0..3], s1 = scales[4..7], s2 = scales[8..11].
// K-quant super-blocks (144 / 176 bytes) keep every field 4-byte aligned.
void scale_min_k4(uint s0, uint s1, uint s2, uint s, out float sc, out float mn) {
    uint sh = (s & 3u) * 8u;
    if (s < 4u) {
        sc = float((s0 >> sh) & 63u);
        mn = float((s1 >> sh) & 63u);
    } else {
        uint a = (s2 >> sh) & 0xFFu;
        sc = float((a & 15u) | (((s0 >> sh) >> 6 & 3u) << 4));
        mn = float((a >> 4) | (((s1 >> sh) >> 6 & 3u) << 4));
    }
}
#if defined(TYPE_Q4_K)
// block_q4_K (144 bytes): f16 d, dmin; uint8 scales[12]; uint8 qs[128].
// Sub-block s (32 values): nibbles (low for even s, high for odd) of qs[32*(s/2) + l];
// x = d*sc[s]*q - dmin*m[s]. 144-byte super-blocks keep every field 16-byte aligned.
void unit_values(uint row_off, uint u, out float v[32]) {
    uint s = u & 7u;
    uint off = row_off + (u >> 3) * 144u;
    uvec4 hd = w_u128a(off);  // d, dmin | scales[0..3] | scales[4..7] | scales[8..11]
    vec2 dm = unpackHalf2x16(hd.x);
    float sc, mn;
    scale_min_k4(hd.y, hd.z, hd.w, s, sc, mn);
    float d1 = dm.x * sc;
    float m1 = dm.y * mn;
    uint qoff = off + 16u + 32u * (s >> 1);
    uint sh = (s & 1u) * 4u;
    [[unroll]] for (uint h = 0u; h < 2u; h++) {
        uvec4 q4 = w_u128a(qoff + 16u * h);
        [[unroll]] for (uint j = 0u; j < 4u; j++) {
            uint q = q4[j];
            [[unroll]] for (uint k = 0u; k < 4u; k++) v[16u * h + 4u * j + k] = d1 * float((q >> (8u * k + sh)) & 15u) - m1;
        }
    }
}
#else
// block_q5_K (176 bytes): f16 d, dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128].
// As Q4_K plus a fifth bit: bit s of qh[l] adds 16. Fields 16-byte aligned.
void unit_values(uint row_off, uint u, out float v[32]) {
    uint s = u & 7u;
    uint off = row_off + (u >> 3) * 176u;
    uvec4 hd = w_u128a(off);
    vec2 dm = unpackHalf2x16(hd.x);
    float sc, mn;
    scale_min_k4(hd.y, hd.z, hd.w, s, sc, mn);
    float d1 = dm.x * sc;
    float m1 = dm.y * mn;
    uint qoff = off + 48u + 32u * (s >> 1);
    uint sh = (s & 1u) * 4u;
    [[unroll]] for (uint h = 0u; h < 2u; h++) {
        uvec4 q4 = w_u128a(qoff + 16u * h);
        uvec4 h4 = w_u128a(off + 16u + 16u * h);
        [[unroll]] for (uint j = 0u; j < 4u; j++) {
            uint q = q4[j];
            uint hb = h4[j];
            [[unroll]] for (uint k = 0u; k < 4u; k++) {
                uint qq = ((q >> (8u * k + sh)) & 15u) | (((hb >> (8u * k + s)) & 1u) << 4);
                v[16u * h + 4u * j + k] = d1 * float(qq) - m1;
            }
        }
    }
}
#endif
#elif defined(TYPE_Q6_K)
// block_q6_K (210 bytes): uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d (offset 208).
// Unit s: half h = s/4, quarter k = s%4; for l < 32:
//   low 4 bits: ql[64h + l + 32*(k&1)], low nibble for k < 2 else high nibble
//   high 2 bits: (qh[32h + l] >> 2k) & 3;  x = d * scales[8h + l/16 + 2k] * (q - 32)
void unit_values(uint row_off, uint u, out float v[32]) {
    uint s = u & 7u;
    uint off = row_off + (u >> 3) * 210u;
    uint h = s >> 2;
    uint k = s & 3u;
    float d = w_f16(off + 208u);
    float d0 = d * float(w_i8(off + 192u + 8u * h + 2u * k));
    float d1 = d * float(w_i8(off + 192u + 8u * h + 2u * k + 1u));
    uint qloff = off + 64u * h + 32u * (k & 1u);
    uint qhoff = off + 128u + 32u * h;
    uint sl = (k >> 1) * 4u;
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        uint ql = w_u32(qloff + 4u * j);
        uint qh = w_u32(qhoff + 4u * j);
        [[unroll]] for (uint i = 0u; i < 4u; i++) {
            uint l = 4u * j + i;
            int q = int(((ql >> (8u * i + sl)) & 15u) | (((qh >> (8u * i + 2u * k)) & 3u) << 4)) - 32;
            v[l] = (l < 16u ? d0 : d1) * float(q);
        }
    }
}
#elif defined(TYPE_MXFP4)
// block_mxfp4 {uint8 e; uint8 qs[16]} (17 bytes, so blocks start at any byte): value j is
// kvalues_mxfp4[qs[j] & 15] * d, value j + 16 kvalues_mxfp4[qs[j] >> 4] * d, with
// d = GGML_E8M0_TO_FP32_HALF(e) = 2^(e - 128) (ggml-quants.c dequantize_row_mxfp4)
const float kvalues_mxfp4[16] = float[16](0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0,
                                          0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);
void unit_values(uint row_off, uint u, out float v[32]) {
    uint b = row_off + u * 17u;
    uint e = w_u8(b);
    float d = uintBitsToFloat(e < 2u ? (0x00200000u << e) : ((e - 1u) << 23));
    [[unroll]] for (uint j = 0u; j < 16u; j++) {
        uint q = w_u8(b + 1u + j);
        v[j] = kvalues_mxfp4[q & 15u] * d;
        v[j + 16u] = kvalues_mxfp4[q >> 4] * d;
    }
}
#elif defined(TYPE_Q2_K)
// block_q2_K (84 bytes): uint8 scales[16]; uint8 qs[64]; f16 d (offset 80), dmin (82).
// Unit s (0..7): half h = s/4, j = s%4; for l < 32: q = (qs[32h + l] >> 2j) & 3,
// sc = scales[2s + l/16]: x = (d * (sc & 15)) * q - dmin * (sc >> 4) (dequantize_row_q2_K).
// 84-byte super-blocks keep every field 4-byte aligned.
void unit_values(uint row_off, uint u, out float v[32]) {
    uint s = u & 7u;
    uint off = row_off + (u >> 3) * 84u;
    vec2 dm = unpackHalf2x16(w_u32a(off + 80u));
    uint sc2 = (w_u32a(off + ((2u * s) & ~3u)) >> (8u * ((2u * s) & 3u))) & 0xFFFFu;  // scales[2s], [2s+1]
    float d0 = dm.x * float(sc2 & 15u), m0 = dm.y * float((sc2 >> 4) & 15u);
    float d1 = dm.x * float((sc2 >> 8) & 15u), m1 = dm.y * float(sc2 >> 12);
    uint qoff = off + 16u + 32u * (s >> 2);
    uint sh = 2u * (s & 3u);
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        uint q = w_u32a(qoff + 4u * j);
        [[unroll]] for (uint k = 0u; k < 4u; k++) {
            uint l = 4u * j + k;
            // precise: no fused multiply-add, so the values are numpy's bit for bit
            precise float y = (l < 16u ? d0 : d1) * float((q >> (8u * k + sh)) & 3u) - (l < 16u ? m0 : m1);
            v[l] = y;
        }
    }
}
#elif defined(TYPE_Q3_K)
// block_q3_K (110 bytes): uint8 hmask[32]; uint8 qs[64]; uint8 scales[12] (offset 96); f16 d (108).
// Unit s (0..7): half h = s/4, j = s%4; for l < 32: q = ((qs[32h + l] >> 2j) & 3) - 4 where
// bit s of hmask[l] is clear; 6-bit scale i = 2s + l/16: low 4 bits (scales[i % 8] >> 4 (i / 8)) & 15,
// high 2 bits (scales[8 + i % 4] >> 2 (i / 4)) & 3; x = (d * (scale - 32)) * q (dequantize_row_q3_K).
// 110-byte super-blocks start at even offsets only (every other one is 4-byte aligned).

// The 8 little-endian words of the 32 bytes at even byte offset o: 9 aligned loads (a misaligned
// word would take two), shifted together without a branch (shift 0 or 16; the second shift is
// split in two so that no shift is by 32, which GLSL leaves undefined).
void q3k_words(uint o, out uint w[8]) {
    uint b = o & ~3u;
    uint sh = (o & 2u) * 8u;
    uint a = w_u32a(b);
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        uint n = w_u32a(b + 4u * j + 4u);  // the 9th word: still inside the block (qs or scales)
        w[j] = (a >> sh) | ((n << 16u) << (16u - sh));
        a = n;
    }
}
void unit_values(uint row_off, uint u, out float v[32]) {
    uint s = u & 7u;
    uint off = row_off + (u >> 3) * 110u;
    float d = w_f16(off + 108u);
    // scales 2s and 2s + 1: their low nibbles sit in bytes 96 + (2s % 8) and the next, high bits in
    // bytes 104 + (2s % 4) and the next, at the same shifts (4 (s / 4) and 2 (s / 2))
    uint lo = w_u16(off + 96u + ((2u * s) & 7u)) >> (4u * (s >> 2));
    uint hi = w_u16(off + 104u + ((2u * s) & 3u)) >> (2u * (s >> 1));
    float d0 = d * float(int((lo & 15u) | ((hi & 3u) << 4)) - 32);
    float d1 = d * float(int(((lo >> 8) & 15u) | (((hi >> 8) & 3u) << 4)) - 32);
    uint q[8], hm[8];
    q3k_words(off + 32u + 32u * (s >> 2), q);
    q3k_words(off, hm);
    uint sh = 2u * (s & 3u);
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        [[unroll]] for (uint k = 0u; k < 4u; k++) {
            uint l = 4u * j + k;
            int qq = int((q[j] >> (8u * k + sh)) & 3u) - (((hm[j] >> (8u * k + s)) & 1u) != 0u ? 0 : 4);
            v[l] = (l < 16u ? d0 : d1) * float(qq);
        }
    }
}
#else
#error "define one TYPE_* (F32 F16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K MXFP4 Q2_K Q3_K)"
#endif
