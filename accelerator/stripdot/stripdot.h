// The C side of package stripdot: the AVX-512 and AVX2 kernels over
// float32, fp16 and bf16 strips, the XLA FFI handler that calls them, and
// the registration of that handler with a PJRT plugin.
#ifndef RECMESH_STRIPDOT_H_
#define RECMESH_STRIPDOT_H_

#include <stdint.h>

// Columns per strip: two 16-float AVX-512 registers, or four 8-float AVX2
// ones.
#define STRIPDOT_WIDTH 32

// A kernel computes out[m][n] = sum_k x[m][k] * w[k][n] where the weights w
// are packed as strips: packed[s][k][j] = w[k][s*32+j]. n must be a
// multiple of 32; out is m rows of n floats. Every kernel computes each
// output as the same chain of fused multiply-adds over k, in order, so all
// of them give the same bits.
typedef void stripdot_kernel(const float* x, int64_t m, int64_t k, const float* packed, int64_t n, float* out);

// A kernel16 is a kernel over strips of fp16 or bf16 weights, which it
// widens to float32 exactly as it loads them: it gives the bits the float32
// kernel gives over the widened strips.
typedef void stripdot_kernel16(const float* x, int64_t m, int64_t k, const uint16_t* packed, int64_t n, float* out);

// The kernels (declared in full, not through the typedefs, for cgo):
// stripdot_multiply_avx512* need AVX-512F, stripdot_multiply_avx2* AVX2,
// FMA and F16C.
void stripdot_multiply_avx512(const float* x, int64_t m, int64_t k, const float* packed, int64_t n, float* out);
void stripdot_multiply_avx512_f16(const float* x, int64_t m, int64_t k, const uint16_t* packed, int64_t n,
                                  float* out);
void stripdot_multiply_avx512_bf16(const float* x, int64_t m, int64_t k, const uint16_t* packed, int64_t n,
                                   float* out);
void stripdot_multiply_avx2(const float* x, int64_t m, int64_t k, const float* packed, int64_t n, float* out);
void stripdot_multiply_avx2_f16(const float* x, int64_t m, int64_t k, const uint16_t* packed, int64_t n,
                                float* out);
void stripdot_multiply_avx2_bf16(const float* x, int64_t m, int64_t k, const uint16_t* packed, int64_t n,
                                 float* out);

// stripdot_set_prefetch sets how many bytes of a strip the AVX-512 kernel
// fetches ahead of use (a multiple of 64); it must not run while a kernel
// does. stripdot_prefetch returns it, stripdot_default_prefetch what suits
// this CPU.
void stripdot_set_prefetch(int64_t bytes);
int64_t stripdot_prefetch(void);
int64_t stripdot_default_prefetch(void);

// The kernels stripdot_register can register.
enum { STRIPDOT_AVX512 = 1, STRIPDOT_AVX2 = 2 };

// stripdot_register registers the FFI handler running kernel (STRIPDOT_*) as
// target_name for platform "Host" with the plugin whose GetPjrtApi lives in
// the already loaded library path. It returns NULL on success, or a message
// the caller frees.
char* stripdot_register(const char* path, const char* target_name, int kernel);

#endif  // RECMESH_STRIPDOT_H_
