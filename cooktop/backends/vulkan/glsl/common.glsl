// Shared helpers of cooktop's Vulkan compute shaders.
//
// Weights are raw GGML blocks (ggml-common.h) stored in a uvec4 buffer
// (`W4`, the byte stream zero-padded to 16 bytes plus one spare uvec4), so that
// the baseline variants need no optional device feature: bytes, halves and
// unaligned words are unpacked from 32-bit loads here. Variants that use 8/16-bit
// storage (enabled by cooktop's patched kp where the device has it) stand in for
// them where available (variants.json "variant_of"). Every block size of the
// types with half-precision fields is even, so those fields sit at even offsets (MXFP4 has none).
//
// Large grids: a dispatch of more than 65535 workgroups is split over y;
// flat_group() gives the linear workgroup index.

uint flat_group() {
    return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
}

#ifdef HAS_WEIGHTS
// The weight buffer is declared `uvec4 W4[]`: one 16-byte load serves four words (on
// lavapipe, where every load of a lane costs the same whatever its width, this
// matters); buffers are padded to 16 bytes plus one spare uvec4.

// 16 bytes at a byte offset `off` that is a multiple of 16
uvec4 w_u128a(uint off) {
    return W4[off >> 4];
}
// uint32 at a byte offset `off` that is a multiple of 4
uint w_u32a(uint off) {
    return W4[off >> 4][(off >> 2) & 3u];
}
// byte at byte offset `off`
uint w_u8(uint off) {
    return (w_u32a(off & ~3u) >> ((off & 3u) << 3)) & 0xFFu;
}
// int8 at byte offset `off`
int w_i8(uint off) {
    return int(w_u8(off) << 24) >> 24;
}
// little-endian uint16 at even byte offset `off`
uint w_u16(uint off) {
    return (w_u32a(off & ~3u) >> ((off & 2u) << 3)) & 0xFFFFu;
}
// float16 at even byte offset `off`
float w_f16(uint off) {
    return unpackHalf2x16(w_u16(off)).x;
}
// little-endian uint32 at even byte offset `off` (may straddle two words)
uint w_u32(uint off) {
    uint a = w_u32a(off & ~3u);
    if ((off & 2u) == 0u) return a;
    return (a >> 16) | (w_u32a((off & ~3u) + 4u) << 16);
}
#endif
