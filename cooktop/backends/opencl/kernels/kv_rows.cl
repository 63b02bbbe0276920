// KV cache rows as float vectors, for the serial (CPU-device, AT_SERIAL) attention kernels of
// attention.cl and attention_kq.cl: VW, the widest of 16/8/4/1 dividing HEAD_DIM; VT its float
// vector type; KVLOAD(row, type, e) values e .. e + VW - 1 of a cache row (kv.cl's kv_loadN);
// VLOAD/VSTORE of a float buffer; VSUM(v) the sum of a VT, in a fixed pairwise order (both files'
// kernels sum in this order, so a flash and a -fa off row agree where their terms do); NV rows'
// vectors per head.
#if AT_SERIAL

#if HEAD_DIM % 16 == 0
#define VW 16
#define VT float16
#define KVLOAD(row, type, e) kv_load16(row, type, e)
#define VLOAD(i, p) vload16(i, p)
#define VSTORE(v, i, p) vstore16(v, i, p)
#define VSUM(v) vsum16(v)
#elif HEAD_DIM % 8 == 0
#define VW 8
#define VT float8
#define KVLOAD(row, type, e) kv_load8(row, type, e)
#define VLOAD(i, p) vload8(i, p)
#define VSTORE(v, i, p) vstore8(v, i, p)
#define VSUM(v) vsum4((v).lo + (v).hi)
#elif HEAD_DIM % 4 == 0
#define VW 4
#define VT float4
#define KVLOAD(row, type, e) kv_load4(row, type, e)
#define VLOAD(i, p) vload4(i, p)
#define VSTORE(v, i, p) vstore4(v, i, p)
#define VSUM(v) vsum4(v)
#else
#define VW 1
#define VT float
#define KVLOAD(row, type, e) kv_load1(row, type, e)
#define VLOAD(i, p) ((p)[i])
#define VSTORE(v, i, p) ((p)[i] = (v))
#define VSUM(v) (v)
#endif
#define NV (HEAD_DIM / VW)

inline float vsum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }
inline float vsum16(float16 v) { float8 a = v.lo + v.hi; return vsum4(a.lo + a.hi); }
#endif
