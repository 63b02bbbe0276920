// KV cache loads: a cache row holds n_head_kv * HEAD_DIM values of one type, chosen at build time
// (KTYPE for K, VTYPE for V; GGML type ids): 0 f32, 1 f16, 30 bf16 (the high half of an f32), 8 q8_0
// (blocks of 32: half d, 32 int8; x = d q), 2 q4_0 (blocks of 32: half d, 16 bytes whose low
// nibbles are values 0..15 and high nibbles 16..31; x = d (q - 8)); ggml-common.h. Blocks run
// along the row, and HEAD_DIM is whole blocks, so a vector of N | 16 values at a multiple of N
// never leaves its block (nor its half of a q4_0 block).
// kv_loadN(row, type, e): values e .. e + N - 1 of the row starting at byte pointer row.
#define KV_F32 0
#define KV_F16 1
#define KV_Q4_0 2
#define KV_Q8_0 8
#define KV_BF16 30

inline size_t kv_row_bytes(const int type, const int n) {
    return type == KV_F32 ? (size_t)n * 4 : type == KV_F16 || type == KV_BF16 ? (size_t)n * 2
         : type == KV_Q8_0 ? (size_t)(n / 32) * 34 : (size_t)(n / 32) * 18;
}

inline float kv_load1(const global uchar *row, const int type, const int e) {
    if (type == KV_F32) return ((const global float *)row)[e];
    if (type == KV_F16) return vload_half(e, (const global half *)row);
    if (type == KV_BF16) return as_float((uint)((const global ushort *)row)[e] << 16);
    const global uchar *b = row + (size_t)(e / 32) * (type == KV_Q8_0 ? 34 : 18);
    const float d = vload_half(0, (const global half *)b);
    if (type == KV_Q8_0) return (float)((const global char *)(b + 2))[e % 32] * d;
    const uchar q = b[2 + e % 16];
    return (float)((e % 32 < 16 ? (q & 15) : (q >> 4)) - 8) * d;
}

#define KV_VEC(N)                                                                                      \
inline float##N kv_load##N(const global uchar *row, const int type, const int e) {                     \
    if (type == KV_F32) return vload##N(0, (const global float *)row + e);                             \
    if (type == KV_F16) return vload_half##N(0, (const global half *)row + e);                         \
    if (type == KV_BF16) return as_float##N(convert_uint##N(vload##N(0, (const global ushort *)row + e)) << 16); \
    const global uchar *b = row + (size_t)(e / 32) * (type == KV_Q8_0 ? 34 : 18);                      \
    const float d = vload_half(0, (const global half *)b);                                            \
    if (type == KV_Q8_0) return convert_float##N(vload##N(0, (const global char *)(b + 2) + e % 32)) * d; \
    const uchar##N q = vload##N(0, b + 2 + e % 16);                                                     \
    return (convert_float##N(e % 32 < 16 ? (q & (uchar)15) : (q >> (uchar)4)) - 8.0f) * d;             \
}
KV_VEC(4)
KV_VEC(8)
KV_VEC(16)
