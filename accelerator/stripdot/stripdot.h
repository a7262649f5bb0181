// The C side of package stripdot: the AVX-512 kernel, the XLA FFI handler
// that calls it, and the registration of that handler with a PJRT plugin.
#ifndef RECMESH_STRIPDOT_H_
#define RECMESH_STRIPDOT_H_

#include <stdint.h>

// Columns per strip: two 16-float AVX-512 registers.
#define STRIPDOT_WIDTH 32

// stripdot_multiply computes out[m][n] = sum_k x[m][k] * w[k][n] where the
// weights w are packed as strips: packed[s][k][j] = w[k][s*32+j]. n must be
// a multiple of 32; out is m rows of n floats.
void stripdot_multiply(const float* x, int64_t m, int64_t k, const float* packed, int64_t n, float* out);

// stripdot_register registers the FFI handler as target_name for platform
// "Host" with the plugin whose GetPjrtApi lives in the already loaded
// library path. It returns NULL on success, or a message the caller frees.
char* stripdot_register(const char* path, const char* target_name);

#endif  // RECMESH_STRIPDOT_H_
