// Shared helpers of cooktop's Vulkan compute shaders.
//
// Weights are raw GGML blocks (ggml-common.h) stored in a uint32 buffer
// (`W`, the byte stream padded with at least one extra zero word), because
// kp 0.9.0 enables no 8/16-bit storage features: bytes, halves and unaligned
// words are unpacked from 32-bit loads here. Every block size of the
// supported types is even, so half-precision fields sit at even offsets.
//
// Large grids: a dispatch of more than 65535 workgroups is split over y;
// flat_group() gives the linear workgroup index.

uint flat_group() {
    return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
}

#ifdef HAS_WEIGHTS
// byte at byte offset `off`
uint w_u8(uint off) {
    return (W[off >> 2] >> ((off & 3u) << 3)) & 0xFFu;
}
// int8 at byte offset `off`
int w_i8(uint off) {
    return int(w_u8(off) << 24) >> 24;
}
// little-endian uint16 at even byte offset `off`
uint w_u16(uint off) {
    return (W[off >> 2] >> ((off & 2u) << 3)) & 0xFFFFu;
}
// float16 at even byte offset `off`
float w_f16(uint off) {
    return unpackHalf2x16(w_u16(off)).x;
}
// uint32 at a byte offset `off` known to be a multiple of 4 (one load)
uint w_u32a(uint off) {
    return W[off >> 2];
}
// little-endian uint32 at even byte offset `off` (may straddle two words)
uint w_u32(uint off) {
    uint i = off >> 2;
    uint a = W[i];
    uint b = W[i + 1u];
    return (off & 2u) != 0u ? ((a >> 16) | (b << 16)) : a;
}
#endif
