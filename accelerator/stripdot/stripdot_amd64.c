// The kernels, the XLA FFI handler and its registration. The structs below
// are the parts of the XLA FFI C API (xla/ffi/api/c_api.h) and of the PJRT C
// API (xla/pjrt/c/pjrt_c_api.h, pjrt_c_api_ffi_extension.h) this file uses,
// written out because neither header ships with the plugin; the layouts are
// the ones of xla-cpu-pjrt 0.0.1 (PJRT C API 0.81, XLA FFI API 0.2).

#include "stripdot.h"

#include <dlfcn.h>
#include <immintrin.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- AVX-512 kernel -------------------------------------------------------

// Rows per block: 2*MR accumulators plus two weight registers and a
// broadcast stay within the 32 zmm registers.
#define MR 12

// Strip rows fetched ahead of use. The hardware prefetcher stops at each
// 4 KiB page, and a page of a strip (32 of its rows) is consumed in a few
// hundred cycles when the block has many rows: without this the kernel
// stalls on memory at every page and reaches a third of its in-cache speed.
// 16 rows (2 KiB) measured best among 8..128 on a Xeon with 2 MiB L2.
#ifndef PREFETCH
#define PREFETCH 16
#endif

#pragma GCC push_options
#pragma GCC target("avx512f,fma")

// block computes rows [0, R) of one 32-column strip: it streams the strip
// (k rows of 32 floats, contiguous) once, keeping every partial sum in
// registers. R is a constant at each call site, so the loops over r unroll.
static inline __attribute__((always_inline)) void block(const float* x, int64_t k, const float* strip,
                                                        float* out, int64_t ldo, const int R) {
  __m512 lo[MR], hi[MR];
#pragma GCC unroll 12
  for (int r = 0; r < R; r++) {
    lo[r] = _mm512_setzero_ps();
    hi[r] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < k; i++) {
    _mm_prefetch((const char*)(strip + (i + PREFETCH) * STRIPDOT_WIDTH), _MM_HINT_T0);
    _mm_prefetch((const char*)(strip + (i + PREFETCH) * STRIPDOT_WIDTH + 16), _MM_HINT_T0);
    const __m512 w0 = _mm512_loadu_ps(strip + i * STRIPDOT_WIDTH);
    const __m512 w1 = _mm512_loadu_ps(strip + i * STRIPDOT_WIDTH + 16);
  #pragma GCC unroll 12
  for (int r = 0; r < R; r++) {
      const __m512 a = _mm512_set1_ps(x[r * k + i]);
      lo[r] = _mm512_fmadd_ps(a, w0, lo[r]);
      hi[r] = _mm512_fmadd_ps(a, w1, hi[r]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; r++) {
    _mm512_storeu_ps(out + r * ldo, lo[r]);
    _mm512_storeu_ps(out + r * ldo + 16, hi[r]);
  }
}

static void rows(const float* x, int64_t k, const float* strip, float* out, int64_t ldo, int64_t r) {
  switch (r) {
    case 1: block(x, k, strip, out, ldo, 1); break;
    case 2: block(x, k, strip, out, ldo, 2); break;
    case 3: block(x, k, strip, out, ldo, 3); break;
    case 4: block(x, k, strip, out, ldo, 4); break;
    case 5: block(x, k, strip, out, ldo, 5); break;
    case 6: block(x, k, strip, out, ldo, 6); break;
    case 7: block(x, k, strip, out, ldo, 7); break;
    case 8: block(x, k, strip, out, ldo, 8); break;
    case 9: block(x, k, strip, out, ldo, 9); break;
    case 10: block(x, k, strip, out, ldo, 10); break;
    case 11: block(x, k, strip, out, ldo, 11); break;
    default: block(x, k, strip, out, ldo, 12); break;
  }
}

void stripdot_multiply_avx512(const float* x, int64_t m, int64_t k, const float* packed, int64_t n,
                              float* out) {
  const int64_t strips = n / STRIPDOT_WIDTH;
  // Blocks of MR rows and one of the rest: the first block streams a strip
  // from memory, the others find it in L2. (Splitting the rows evenly, 16 as
  // 8 + 8, measured slower at 16 to 32 rows: the pass that streams from
  // memory should carry the most rows.)
  for (int64_t s = 0; s < strips; s++) {
    const float* strip = packed + s * k * STRIPDOT_WIDTH;
    for (int64_t r0 = 0; r0 < m; r0 += MR) {
      const int64_t r = m - r0 < MR ? m - r0 : MR;
      rows(x + r0 * k, k, strip, out + r0 * n + s * STRIPDOT_WIDTH, n, r);
    }
  }
}

#pragma GCC pop_options

// ---- AVX2 kernel ----------------------------------------------------------
//
// For CPUs with AVX2 and FMA but no AVX-512 (AMD EPYC before Zen 4, and
// VMs that hide AVX-512). It reads the same packed strips: with 16 ymm
// registers a whole 32-column strip (four registers a row) leaves room for
// the accumulators of only two rows, so each block covers one 16-column
// half of the strip (two registers a row) for up to MR2 rows, and the two
// halves run one after the other. Each output element is still the FMA
// chain over k from zero, in order, so the result equals the AVX-512
// kernel's bit for bit.
//
// MR2 and PREFETCH_AVX2 were tuned on an AVX-512 Xeon running this path
// (the only machine at hand), so they are to be measured again on an
// AVX2-only host, whose caches and memory latency differ (Zen 2 and 3 have
// 512 KiB of L2, barely more than the widest strip of the MLPerf network).

// Rows per block: 2*MR2 accumulators plus two weight registers and a
// broadcast fill 15 of the 16 ymm registers; fewer rows would stream each
// strip from L2 more often for the same arithmetic.
#define MR2 6

// Strip rows fetched ahead of use, for the same reason as PREFETCH. The
// first half's pass fetches both cache lines of each strip row, so that
// the second half's finds them in L2 and only one pass over a strip reads
// memory. 8 to 24 rows measured alike within the noise of a shared 2-core
// VM, 32 and 64 no better; 16 is the AVX-512 kernel's distance.
#ifndef PREFETCH_AVX2
#define PREFETCH_AVX2 16
#endif

#define AVX2 __attribute__((target("avx2,fma")))

// block_avx2 computes rows [0, R) of 16 columns of a strip, half pointing
// at the strip's first row in those columns. R is a constant at each call
// site, so the loops over r unroll. whole says whether to prefetch the
// strip's other half too.
static inline __attribute__((always_inline)) AVX2 void block_avx2(const float* x, int64_t k, const float* half,
                                                                  float* out, int64_t ldo, const int R,
                                                                  const int whole) {
  __m256 lo[MR2], hi[MR2];
#pragma GCC unroll 6
  for (int r = 0; r < R; r++) {
    lo[r] = _mm256_setzero_ps();
    hi[r] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < k; i++) {
    _mm_prefetch((const char*)(half + (i + PREFETCH_AVX2) * STRIPDOT_WIDTH), _MM_HINT_T0);
    if (whole) {
      _mm_prefetch((const char*)(half + (i + PREFETCH_AVX2) * STRIPDOT_WIDTH + 16), _MM_HINT_T0);
    }
    const __m256 w0 = _mm256_loadu_ps(half + i * STRIPDOT_WIDTH);
    const __m256 w1 = _mm256_loadu_ps(half + i * STRIPDOT_WIDTH + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
      const __m256 a = _mm256_broadcast_ss(x + r * k + i);
      lo[r] = _mm256_fmadd_ps(a, w0, lo[r]);
      hi[r] = _mm256_fmadd_ps(a, w1, hi[r]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; r++) {
    _mm256_storeu_ps(out + r * ldo, lo[r]);
    _mm256_storeu_ps(out + r * ldo + 8, hi[r]);
  }
}

// rows_avx2 computes r rows of a whole strip, first half then second.
static AVX2 void rows_avx2(const float* x, int64_t k, const float* strip, float* out, int64_t ldo, int64_t r) {
  switch (r) {
    case 1: block_avx2(x, k, strip, out, ldo, 1, 1); block_avx2(x, k, strip + 16, out + 16, ldo, 1, 0); break;
    case 2: block_avx2(x, k, strip, out, ldo, 2, 1); block_avx2(x, k, strip + 16, out + 16, ldo, 2, 0); break;
    case 3: block_avx2(x, k, strip, out, ldo, 3, 1); block_avx2(x, k, strip + 16, out + 16, ldo, 3, 0); break;
    case 4: block_avx2(x, k, strip, out, ldo, 4, 1); block_avx2(x, k, strip + 16, out + 16, ldo, 4, 0); break;
    case 5: block_avx2(x, k, strip, out, ldo, 5, 1); block_avx2(x, k, strip + 16, out + 16, ldo, 5, 0); break;
    default: block_avx2(x, k, strip, out, ldo, 6, 1); block_avx2(x, k, strip + 16, out + 16, ldo, 6, 0); break;
  }
}

AVX2 void stripdot_multiply_avx2(const float* x, int64_t m, int64_t k, const float* packed, int64_t n, float* out) {
  const int64_t strips = n / STRIPDOT_WIDTH;
  // Full blocks first and the rest last, as in the AVX-512 kernel.
  for (int64_t s = 0; s < strips; s++) {
    const float* strip = packed + s * k * STRIPDOT_WIDTH;
    for (int64_t r0 = 0; r0 < m; r0 += MR2) {
      const int64_t r = m - r0 < MR2 ? m - r0 : MR2;
      rows_avx2(x + r0 * k, k, strip, out + r0 * n + s * STRIPDOT_WIDTH, n, r);
    }
  }
}

// ---- XLA FFI handler ------------------------------------------------------

typedef struct ffi_ext_base {
  size_t struct_size;
  int type;  // 1: metadata
  struct ffi_ext_base* next;
} ffi_ext_base;

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  int major_version;
  int minor_version;
} ffi_api_version;

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  const char* message;
  int errc;
} ffi_error_create_args;

typedef void* ffi_error_create(ffi_error_create_args* args);

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  ffi_api_version api_version;
  const void* internal_api;
  ffi_error_create* error_create;
} ffi_api;

typedef struct {
  size_t struct_size;
  ffi_api_version api_version;
  uint32_t traits;
} ffi_metadata;

typedef struct {
  ffi_ext_base base;
  ffi_metadata* metadata;
} ffi_metadata_extension;

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  int dtype;  // 11: F32
  void* data;
  int64_t rank;
  int64_t* dims;
} ffi_buffer;

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  int64_t size;
  int* types;  // 1: buffer
  void** values;
} ffi_list;

typedef struct {
  size_t struct_size;
  ffi_ext_base* extension_start;
  const ffi_api* api;
  void* ctx;
  int stage;  // 3: execute
  ffi_list args;
  ffi_list rets;
} ffi_call_frame;

enum { ffiMetadata = 1, ffiExecute = 3, ffiBuffer = 1, ffiF32 = 11, ffiInvalidArgument = 3 };

static void* fail(const ffi_call_frame* f, const char* msg) {
  ffi_error_create_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.message = msg;
  a.errc = ffiInvalidArgument;
  return f->api->error_create(&a);
}

// handle is the custom call: x [m, k] and packed weights [n/32, k, 32]
// in, out [m, n/32, 32] (row-major, so the bytes of [m, n]), computed by
// kernel.
static void* handle(ffi_call_frame* f, stripdot_kernel* kernel) {
  const ffi_ext_base* ext = f->extension_start;
  if (ext != NULL && ext->type == ffiMetadata) {
    // Registration asks which FFI version the handler speaks: the one of
    // the runtime calling it, whose fields it uses.
    ffi_metadata* md = ((const ffi_metadata_extension*)ext)->metadata;
    md->api_version.struct_size = sizeof md->api_version;
    md->api_version.extension_start = NULL;
    md->api_version.major_version = f->api->api_version.major_version;
    md->api_version.minor_version = f->api->api_version.minor_version;
    md->traits = 0;
    return NULL;
  }
  if (f->stage != ffiExecute) {
    return NULL;
  }
  if (f->args.size != 2 || f->rets.size != 1 || f->args.types[0] != ffiBuffer || f->args.types[1] != ffiBuffer ||
      f->rets.types[0] != ffiBuffer) {
    return fail(f, "recmesh strip dot: want two buffer arguments and one buffer result");
  }
  const ffi_buffer* x = f->args.values[0];
  const ffi_buffer* w = f->args.values[1];
  const ffi_buffer* o = f->rets.values[0];
  if (x->dtype != ffiF32 || w->dtype != ffiF32 || o->dtype != ffiF32) {
    return fail(f, "recmesh strip dot: every buffer must be f32");
  }
  if (x->rank != 2 || w->rank != 3 || o->rank != 3 || w->dims[2] != STRIPDOT_WIDTH || w->dims[1] != x->dims[1] ||
      o->dims[0] != x->dims[0] || o->dims[1] != w->dims[0] || o->dims[2] != STRIPDOT_WIDTH) {
    return fail(f, "recmesh strip dot: want x [m,k], weights [s,k,32] and result [m,s,32]");
  }
  kernel(x->data, x->dims[0], x->dims[1], w->data, w->dims[0] * STRIPDOT_WIDTH, o->data);
  return NULL;
}

// One handler per kernel: XLA calls a handler with the call frame alone.
static void* handler_avx512(ffi_call_frame* f) { return handle(f, stripdot_multiply_avx512); }
static void* handler_avx2(ffi_call_frame* f) { return handle(f, stripdot_multiply_avx2); }

// ---- registration with the PJRT plugin ------------------------------------

typedef struct pjrt_ext_base {
  size_t struct_size;
  int type;  // 5: FFI
  struct pjrt_ext_base* next;
} pjrt_ext_base;

typedef struct {
  size_t struct_size;
  pjrt_ext_base* extension_start;
  const void* error;
  const char* message;
  size_t message_size;
} pjrt_error_message_args;

typedef struct {
  size_t struct_size;
  pjrt_ext_base* extension_start;
  void* error;
} pjrt_error_destroy_args;

typedef struct {
  size_t struct_size;
  pjrt_ext_base* extension_start;
  struct {
    size_t struct_size;
    pjrt_ext_base* extension_start;
    int major_version;
    int minor_version;
  } version;
  void (*error_destroy)(pjrt_error_destroy_args*);
  void (*error_message)(pjrt_error_message_args*);
} pjrt_api;

// The registration arguments of this plugin's FFI extension: newer headers
// add an api_version field after target_name_size.
typedef struct {
  size_t struct_size;
  const char* target_name;
  size_t target_name_size;
  void* handler;
  const char* platform_name;
  size_t platform_name_size;
  uint32_t traits;
} pjrt_ffi_register_args;

typedef struct {
  pjrt_ext_base base;
  void* type_id_register;
  void* user_data_add;
  void* (*register_handler)(pjrt_ffi_register_args*);
} pjrt_ffi_extension;

enum { pjrtExtensionFFI = 5 };

static char* message(const char* format, const char* detail) {
  size_t n = strlen(format) + strlen(detail) + 1;
  char* s = malloc(n);
  snprintf(s, n, format, detail);
  return s;
}

char* stripdot_register(const char* path, const char* target_name, int kernel) {
  void* handler;
  switch (kernel) {
    case STRIPDOT_AVX512: handler = (void*)handler_avx512; break;
    case STRIPDOT_AVX2: handler = (void*)handler_avx2; break;
    default: {
      char* s = malloc(32);
      snprintf(s, 32, "unknown kernel %d", kernel);
      return s;
    }
  }
  void* lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (lib == NULL) {
    return message("plugin %s is not loaded", path);
  }
  const pjrt_api* (*get_api)(void) = (const pjrt_api* (*)(void))dlsym(lib, "GetPjrtApi");
  dlclose(lib);  // the plugin stays loaded: its loader holds it
  if (get_api == NULL) {
    return message("plugin %s has no GetPjrtApi", path);
  }
  const pjrt_api* api = get_api();
  const pjrt_ffi_extension* ffi = NULL;
  for (const pjrt_ext_base* e = api->extension_start; e != NULL; e = e->next) {
    if (e->type == pjrtExtensionFFI && e->struct_size >= sizeof(pjrt_ffi_extension)) {
      ffi = (const pjrt_ffi_extension*)e;
      break;
    }
  }
  if (ffi == NULL || ffi->register_handler == NULL) {
    return message("plugin %s has no FFI extension", path);
  }
  pjrt_ffi_register_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.target_name = target_name;
  a.target_name_size = strlen(target_name);
  a.handler = handler;
  a.platform_name = "Host";
  a.platform_name_size = 4;
  void* err = ffi->register_handler(&a);
  if (err == NULL) {
    return NULL;
  }
  pjrt_error_message_args m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  m.error = err;
  api->error_message(&m);
  char* detail = malloc(m.message_size + 1);
  memcpy(detail, m.message, m.message_size);
  detail[m.message_size] = 0;
  pjrt_error_destroy_args d;
  memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.error = err;
  api->error_destroy(&d);
  char* out = message("register FFI handler: %s", detail);
  free(detail);
  return out;
}
