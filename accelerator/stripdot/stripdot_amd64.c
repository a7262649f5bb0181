// The kernels, the XLA FFI handler and its registration. The structs below
// are the parts of the XLA FFI C API (xla/ffi/api/c_api.h) and of the PJRT C
// API (xla/pjrt/c/pjrt_c_api.h, pjrt_c_api_ffi_extension.h) this file uses,
// written out because neither header ships with the plugin; the layouts are
// the ones of xla-cpu-pjrt 0.0.1 (PJRT C API 0.81, XLA FFI API 0.2).

#include "stripdot.h"

#include <cpuid.h>
#include <dlfcn.h>
#include <immintrin.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Element types of the weights. Each kernel body below takes one as a
// constant argument and is inlined into one function per type, so the
// widening is chosen at compile time and the loop is the float32 one with
// a conversion after each load. The widening is exact (a float32 holds
// every fp16 and bf16 value), so a kernel over half weights gives the bits
// its float32 twin gives over the widened weights.
enum { ELEM_F32, ELEM_F16, ELEM_BF16 };

#define ELEM_SIZE(elem) ((elem) == ELEM_F32 ? 4 : 2)

// ---- AVX-512 kernel -------------------------------------------------------

// Rows per block: 2*MR accumulators plus two weight registers and a
// broadcast stay within the 32 zmm registers.
#define MR 12

// Bytes of a strip the AVX-512 kernel fetches ahead of use
// (stripdot_set_prefetch). The hardware prefetcher stops at each 4 KiB
// page, and a page of a strip is consumed in a few hundred cycles when the
// block has many rows: without this the kernel stalls on memory at every
// page and reaches a third of its in-cache speed. Enough is what keeps the
// core's memory busy, so it differs between CPUs (stripdot_default_prefetch).
// PREFETCH_OTHER is the distance of CPUs other than AMD's, and the one a
// process has until package stripdot's init sets its CPU's.
#define PREFETCH_OTHER 2048
#define PREFETCH_AMD 8192

static int64_t prefetch_bytes = PREFETCH_OTHER;

void stripdot_set_prefetch(int64_t bytes) { prefetch_bytes = bytes; }

int64_t stripdot_prefetch(void) { return prefetch_bytes; }

// On a Xeon (Sapphire Rapids, 2 MiB of L2) 2 KiB ahead (16 float32 strip
// rows, 32 half ones) measured best among 1 to 16 KiB. On an AMD EPYC
// (Zen 5, 1 MiB of L2, one core reading memory at about 49 GB/s) 8 KiB was
// best among 2 to 12 KiB: float32 at 16 rows 1.2-1.3x, fp16 at one row
// 1.2-1.3x, against 2 KiB in the same run.
int64_t stripdot_default_prefetch(void) {
  unsigned a, b, c, d;
  if (__get_cpuid(0, &a, &b, &c, &d) && b == signature_AMD_ebx && c == signature_AMD_ecx && d == signature_AMD_edx) {
    return PREFETCH_AMD;
  }
  return PREFETCH_OTHER;
}

#pragma GCC push_options
#pragma GCC target("avx512f,fma")

// load16 returns the 16 weights at p widened to float32.
static inline __attribute__((always_inline)) __m512 load16(const char* p, const int elem) {
  switch (elem) {
    case ELEM_F16:
      return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
    case ELEM_BF16:
      // A bf16 is the high half of the float32 with the same value.
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
    default:
      return _mm512_loadu_ps((const float*)p);
  }
}

// block computes rows [0, R) of one 32-column strip: it streams the strip
// (k rows of 32 weights, contiguous) once, keeping every partial sum in
// registers. R and elem are constants at each call site, so the loops over
// r unroll and the widening is fixed.
static inline __attribute__((always_inline)) void block(const float* x, int64_t k, const char* strip, float* out,
                                                        int64_t ldo, const int R, const int elem) {
  const int64_t row = STRIPDOT_WIDTH * ELEM_SIZE(elem);
  const int64_t ahead = prefetch_bytes;
  __m512 lo[MR], hi[MR];
#pragma GCC unroll 12
  for (int r = 0; r < R; r++) {
    lo[r] = _mm512_setzero_ps();
    hi[r] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < k; i++) {
    const char* w = strip + i * row;
    _mm_prefetch(w + ahead, _MM_HINT_T0);
    if (row > 64) {
      _mm_prefetch(w + ahead + 64, _MM_HINT_T0);
    }
    const __m512 w0 = load16(w, elem);
    const __m512 w1 = load16(w + 16 * ELEM_SIZE(elem), elem);
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

static inline __attribute__((always_inline)) void rows(const float* x, int64_t k, const char* strip, float* out,
                                                       int64_t ldo, int64_t r, const int elem) {
  switch (r) {
    case 1: block(x, k, strip, out, ldo, 1, elem); break;
    case 2: block(x, k, strip, out, ldo, 2, elem); break;
    case 3: block(x, k, strip, out, ldo, 3, elem); break;
    case 4: block(x, k, strip, out, ldo, 4, elem); break;
    case 5: block(x, k, strip, out, ldo, 5, elem); break;
    case 6: block(x, k, strip, out, ldo, 6, elem); break;
    case 7: block(x, k, strip, out, ldo, 7, elem); break;
    case 8: block(x, k, strip, out, ldo, 8, elem); break;
    case 9: block(x, k, strip, out, ldo, 9, elem); break;
    case 10: block(x, k, strip, out, ldo, 10, elem); break;
    case 11: block(x, k, strip, out, ldo, 11, elem); break;
    default: block(x, k, strip, out, ldo, 12, elem); break;
  }
}

static inline __attribute__((always_inline)) void multiply_avx512(const float* x, int64_t m, int64_t k,
                                                                  const void* packed, int64_t n, float* out,
                                                                  const int elem) {
  const int64_t strips = n / STRIPDOT_WIDTH;
  // Blocks of MR rows and one of the rest: the first block streams a strip
  // from memory, the others find it in L2. (Splitting the rows evenly, 16 as
  // 8 + 8, measured slower at 16 to 32 rows: the pass that streams from
  // memory should carry the most rows.)
  for (int64_t s = 0; s < strips; s++) {
    const char* strip = (const char*)packed + s * k * STRIPDOT_WIDTH * ELEM_SIZE(elem);
    for (int64_t r0 = 0; r0 < m; r0 += MR) {
      const int64_t r = m - r0 < MR ? m - r0 : MR;
      rows(x + r0 * k, k, strip, out + r0 * n + s * STRIPDOT_WIDTH, n, r, elem);
    }
  }
}

void stripdot_multiply_avx512(const float* x, int64_t m, int64_t k, const float* packed, int64_t n,
                              float* out) {
  multiply_avx512(x, m, k, packed, n, out, ELEM_F32);
}

void stripdot_multiply_avx512_f16(const float* x, int64_t m, int64_t k, const uint16_t* packed, int64_t n,
                                  float* out) {
  multiply_avx512(x, m, k, packed, n, out, ELEM_F16);
}

void stripdot_multiply_avx512_bf16(const float* x, int64_t m, int64_t k, const uint16_t* packed, int64_t n,
                                   float* out) {
  multiply_avx512(x, m, k, packed, n, out, ELEM_BF16);
}

#pragma GCC pop_options

// ---- AVX2 kernel ----------------------------------------------------------
//
// For CPUs with AVX2 and FMA but no AVX-512 (AMD EPYC before Zen 4, and
// VMs that hide AVX-512). It reads the same packed strips. With 16 ymm
// registers a whole 32-column strip (four registers a row) leaves room for
// the accumulators of only two rows, so up to MR2_WIDE rows take a strip in
// one pass and more rows take it in 16-column halves (two registers a row)
// for up to MR2 rows a block, the halves one after the other.
//
// The AVX-512 kernel streams each strip from memory in its first block and
// finds it in L2 for the others. On Zen 3 (AMD EPYC, 512 KiB of L2 per
// core, one core reading memory at 16-18 GB/s) that left memory idle while
// the later blocks and halves ran from L2, and the widest strips of the
// MLPerf network (3,456 rows, 432 KiB) barely fit in L2 at all. So this
// kernel walks each strip in chunks of KC2 rows and, while it computes one
// chunk, prefetches the next one (the next bytes of the packed weights,
// in this strip or the next) spread evenly over all of the chunk's passes:
// memory streams the whole time, every pass reads L2, and two chunks
// (128 KiB in float32) sit well inside L2. Between chunks the partial sums
// go through out, which does not round them: each output element is still
// the FMA chain over k from zero, in order, so the result equals the
// AVX-512 kernel's bit for bit.
//
// Measured on the MLPerf network's products on one core of an AMD EPYC
// (Zen 3) VM, against the same kernel without chunks, best of 7 each,
// interleaved: float32 1.1-1.3x at 1 to 4 rows, 1.1-1.7x at 8 and 16,
// 0.85-1.3x at 32 to 128 (where that VM's neighbours moved single runs by
// 30 %); fp16 strips 1.3-1.5x at 1 and 2 rows. KC2 of 256 and 1024
// measured alike within the noise, as did prefetching into L2 only or
// non-temporally. The executor's start-up race still picks XLA's dot for
// any bucket where this loses.

// Rows per block when a block takes half a strip: 2*MR2 accumulators plus
// two weight registers and a broadcast fill 15 of the 16 ymm registers.
#define MR2 6

// Rows that take a whole strip in one pass: 4*MR2_WIDE accumulators plus
// four weight registers and a broadcast.
#define MR2_WIDE 2

// Strip rows per chunk.
#ifndef KC2
#define KC2 512
#endif

// Strip rows fetched ahead of use within a chunk, for the same reason as
// the AVX-512 kernel's prefetch: the chunk after the first is already on
// its way to L2, and this brings it on to L1; for the first chunk of a
// product it is the only prefetch.
#ifndef PREFETCH_AVX2
#define PREFETCH_AVX2 16
#endif

// PREFETCH_AVX2 for half strips, whose rows are one cache line: the same
// bytes ahead.
#ifndef PREFETCH_AVX2_HALF
#define PREFETCH_AVX2_HALF (2 * PREFETCH_AVX2)
#endif

// F16C is for the fp16 strips' VCVTPH2PS; every kernel of the family
// carries it, since Go offers the AVX2 kernel only on CPUs that have it.
#define AVX2 __attribute__((target("avx2,fma,f16c")))

// load8 returns the 8 weights at p widened to float32.
static inline __attribute__((always_inline)) AVX2 __m256 load8(const char* p, const int elem) {
  switch (elem) {
    case ELEM_F16:
      return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
    case ELEM_BF16:
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
    default:
      return _mm256_loadu_ps((const float*)p);
  }
}

// pass_avx2 computes rows [0, R) of W*8 columns of a strip over kc of its
// rows: w points at the first of those rows in those columns, x and out at
// the rows' first elements (row strides ldx and ldo). first says whether
// the sums start at zero or at what out holds. Over the pass it prefetches
// slice bytes from next (none where next is NULL), in even steps. R, W
// and elem are constants at each call site, so the loops over r and j
// unroll and the widening is fixed.
static inline __attribute__((always_inline)) AVX2 void pass_avx2(const float* x, int64_t ldx, int64_t kc,
                                                                 const char* w, float* out, int64_t ldo,
                                                                 const int first, const char* next,
                                                                 int64_t slice, const int R, const int W,
                                                                 const int elem) {
  const int64_t row = STRIPDOT_WIDTH * ELEM_SIZE(elem);
  const int64_t ahead = (elem == ELEM_F32 ? PREFETCH_AVX2 : PREFETCH_AVX2_HALF) * row;
  // The prefetch of row i goes to next + i*slice/kc, in 16.16 fixed point
  // to keep a division out of the loop, and takes two lines where the
  // slice is more than a line a row.
  const int64_t step = next != NULL ? (slice << 16) / kc : 0;
  const int two = slice > 64 * kc;
  __m256 acc[MR2][4];
#pragma GCC unroll 6
  for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
    for (int j = 0; j < W; j++) {
      acc[r][j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(out + r * ldo + 8 * j);
    }
  }
  for (int64_t i = 0; i < kc; i++) {
    const char* wi = w + i * row;
    _mm_prefetch(wi + ahead, _MM_HINT_T0);
    if (W == 4 && row > 64) {
      _mm_prefetch(wi + ahead + 64, _MM_HINT_T0);
    }
    if (next != NULL) {
      const char* p = next + ((i * step) >> 16);
      _mm_prefetch(p, _MM_HINT_T0);
      if (two) {
        _mm_prefetch(p + 64, _MM_HINT_T0);
      }
    }
    __m256 wv[4];
#pragma GCC unroll 4
    for (int j = 0; j < W; j++) {
      wv[j] = load8(wi + 8 * j * ELEM_SIZE(elem), elem);
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
      const __m256 a = _mm256_broadcast_ss(x + r * ldx + i);
#pragma GCC unroll 4
      for (int j = 0; j < W; j++) {
        acc[r][j] = _mm256_fmadd_ps(a, wv[j], acc[r][j]);
      }
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
    for (int j = 0; j < W; j++) {
      _mm256_storeu_ps(out + r * ldo + 8 * j, acc[r][j]);
    }
  }
}

#define PASS_AVX2(R, W) pass_avx2(x, ldx, kc, w, out, ldo, first, next, slice, R, W, elem)

// rows_avx2 is pass_avx2 for r rows, r at most MR2_WIDE where wide (W = 4)
// and at most MR2 otherwise (W = 2).
static inline __attribute__((always_inline)) AVX2 void rows_avx2(const float* x, int64_t ldx, int64_t kc,
                                                                 const char* w, float* out, int64_t ldo,
                                                                 const int first, const char* next,
                                                                 int64_t slice, int64_t r, const int wide,
                                                                 const int elem) {
  if (wide) {
    switch (r) {
      case 1: PASS_AVX2(1, 4); break;
      default: PASS_AVX2(2, 4); break;
    }
    return;
  }
  switch (r) {
    case 1: PASS_AVX2(1, 2); break;
    case 2: PASS_AVX2(2, 2); break;
    case 3: PASS_AVX2(3, 2); break;
    case 4: PASS_AVX2(4, 2); break;
    case 5: PASS_AVX2(5, 2); break;
    default: PASS_AVX2(6, 2); break;
  }
}

static inline __attribute__((always_inline)) AVX2 void multiply_avx2(const float* x, int64_t m, int64_t k,
                                                                     const void* packed, int64_t n, float* out,
                                                                     const int elem) {
  if (m <= 0) {
    return;  // nothing to compute, and no passes to share the prefetch
  }
  const int64_t strips = n / STRIPDOT_WIDTH;
  const int64_t row = STRIPDOT_WIDTH * ELEM_SIZE(elem);
  const int wide = m <= MR2_WIDE;
  const int64_t mr = wide ? MR2_WIDE : MR2;
  // Passes over each chunk: one a block when wide, else two (the halves).
  const int64_t passes = (wide ? 1 : 2) * ((m + mr - 1) / mr);
  for (int64_t s = 0; s < strips; s++) {
    for (int64_t c0 = 0; c0 < k; c0 += KC2) {
      const int64_t kc = k - c0 < KC2 ? k - c0 : KC2;
      const char* chunk = (const char*)packed + (s * k + c0) * row;
      // The next chunk's rows: the rest of this strip, or the next strip's
      // first chunk, or none after the last.
      int64_t nk = 0;
      if (c0 + kc < k) {
        nk = k - c0 - kc < KC2 ? k - c0 - kc : KC2;
      } else if (s + 1 < strips) {
        nk = k < KC2 ? k : KC2;
      }
      // Each pass prefetches its share of the next chunk, in whole lines.
      const int64_t slice = (nk * row / passes + 63) & ~(int64_t)63;
      const int first = c0 == 0;
      int64_t p = 0;
      for (int64_t r0 = 0; r0 < m; r0 += mr) {
        const int64_t r = m - r0 < mr ? m - r0 : mr;
        const float* xb = x + r0 * k + c0;
        float* ob = out + r0 * n + s * STRIPDOT_WIDTH;
        rows_avx2(xb, k, kc, chunk, ob, n, first, nk ? chunk + kc * row + p++ * slice : NULL, slice, r, wide, elem);
        if (!wide) {
          rows_avx2(xb, k, kc, chunk + 16 * ELEM_SIZE(elem), ob + 16, n, first,
                    nk ? chunk + kc * row + p++ * slice : NULL, slice, r, 0, elem);
        }
      }
    }
  }
}

AVX2 void stripdot_multiply_avx2(const float* x, int64_t m, int64_t k, const float* packed, int64_t n, float* out) {
  multiply_avx2(x, m, k, packed, n, out, ELEM_F32);
}

AVX2 void stripdot_multiply_avx2_f16(const float* x, int64_t m, int64_t k, const uint16_t* packed, int64_t n,
                                     float* out) {
  multiply_avx2(x, m, k, packed, n, out, ELEM_F16);
}

AVX2 void stripdot_multiply_avx2_bf16(const float* x, int64_t m, int64_t k, const uint16_t* packed, int64_t n,
                                      float* out) {
  multiply_avx2(x, m, k, packed, n, out, ELEM_BF16);
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
  int dtype;  // 10: F16, 11: F32, 16: BF16
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

enum { ffiMetadata = 1, ffiExecute = 3, ffiBuffer = 1, ffiF16 = 10, ffiF32 = 11, ffiBF16 = 16, ffiInvalidArgument = 3 };

static void* fail(const ffi_call_frame* f, const char* msg) {
  ffi_error_create_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.message = msg;
  a.errc = ffiInvalidArgument;
  return f->api->error_create(&a);
}

// family is one kernel for each element type of the weights.
typedef struct {
  stripdot_kernel* f32;
  stripdot_kernel16* f16;
  stripdot_kernel16* bf16;
} family;

// handle is the custom call: x [m, k] and packed weights [n/32, k, 32]
// in, out [m, n/32, 32] (row-major, so the bytes of [m, n]), computed by
// the kernel of ks for the weights' element type.
static void* handle(ffi_call_frame* f, const family* ks) {
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
  if (x->dtype != ffiF32 || o->dtype != ffiF32) {
    return fail(f, "recmesh strip dot: x and the result must be f32");
  }
  if (w->dtype != ffiF32 && w->dtype != ffiF16 && w->dtype != ffiBF16) {
    return fail(f, "recmesh strip dot: the weights must be f32, f16 or bf16");
  }
  if (x->rank != 2 || w->rank != 3 || o->rank != 3 || w->dims[2] != STRIPDOT_WIDTH || w->dims[1] != x->dims[1] ||
      o->dims[0] != x->dims[0] || o->dims[1] != w->dims[0] || o->dims[2] != STRIPDOT_WIDTH) {
    return fail(f, "recmesh strip dot: want x [m,k], weights [s,k,32] and result [m,s,32]");
  }
  const int64_t m = x->dims[0], k = x->dims[1], n = w->dims[0] * STRIPDOT_WIDTH;
  switch (w->dtype) {
    case ffiF16: ks->f16(x->data, m, k, w->data, n, o->data); break;
    case ffiBF16: ks->bf16(x->data, m, k, w->data, n, o->data); break;
    default: ks->f32(x->data, m, k, w->data, n, o->data); break;
  }
  return NULL;
}

static const family avx512 = {stripdot_multiply_avx512, stripdot_multiply_avx512_f16, stripdot_multiply_avx512_bf16};
static const family avx2 = {stripdot_multiply_avx2, stripdot_multiply_avx2_f16, stripdot_multiply_avx2_bf16};

// One handler per kernel: XLA calls a handler with the call frame alone.
static void* handler_avx512(ffi_call_frame* f) { return handle(f, &avx512); }
static void* handler_avx2(ffi_call_frame* f) { return handle(f, &avx2); }

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
