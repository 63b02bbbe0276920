// KV cache rows in a uint[] buffer: GGML rows of one type each (ggml-common.h), chosen per
// dispatch by a push constant (GGML type ids): 0 f32, 1 f16, 30 bf16 (the high half of an f32),
// 8 q8_0 (blocks of 32: half d, 32 int8; x = d q), 2 q4_0 (blocks of 32: half d, 16 bytes whose low
// nibbles are values 0..15 and high nibbles 16..31; x = d (q - 8)). Blocks run along the row.
// A row of n values is kv_row_bytes(type, n) bytes; f32/f16/bf16 rows start at a multiple of 4 bytes
// (kv_dim is even: rope needs an even head_dim), block rows at an even byte (halves sit there).
#define KV_F32 0u
#define KV_F16 1u
#define KV_Q4_0 2u
#define KV_Q8_0 8u
#define KV_BF16 30u

uint kv_row_bytes(uint type, uint n) {
    return type == KV_F32 ? n * 4u : (type == KV_F16 || type == KV_BF16) ? n * 2u
         : type == KV_Q8_0 ? (n / 32u) * 34u : (n / 32u) * 18u;
}

// float KV_LOADER(uint type, uint row_byte, uint e): value e of the row at byte row_byte of BUF
#define KV_LOADER(NAME, BUF)                                                                        \
float NAME(uint type, uint row_byte, uint e) {                                                      \
    if (type == KV_F32) return uintBitsToFloat(BUF[(row_byte >> 2) + e]);                            \
    if (type == KV_F16) return unpackHalf2x16(BUF[(row_byte >> 2) + (e >> 1)] >> ((e & 1u) << 4)).x; \
    if (type == KV_BF16) return uintBitsToFloat((BUF[(row_byte >> 2) + (e >> 1)] >> ((e & 1u) << 4)) << 16); \
    uint b = row_byte + (e >> 5) * (type == KV_Q8_0 ? 34u : 18u);                                    \
    float d = unpackHalf2x16(BUF[b >> 2] >> ((b & 2u) << 3)).x;                                      \
    uint j = e & 31u;                                                                                \
    if (type == KV_Q8_0) {                                                                           \
        uint o = b + 2u + j;                                                                         \
        return float(int(BUF[o >> 2] << (24u - ((o & 3u) << 3))) >> 24) * d;                       \
    }                                                                                                \
    uint o = b + 2u + (j & 15u);                                                                     \
    uint q = (BUF[o >> 2] >> ((o & 3u) << 3)) & 0xFFu;                                              \
    return float(int(j < 16u ? (q & 15u) : (q >> 4)) - 8) * d;                                      \
}
