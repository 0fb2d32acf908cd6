/* cblas_sgemm for products of a few rows, through cblas_sgemv.
 *
 * MLX's CPU matmul always calls cblas_sgemm. For a product with one row (a decode step of
 * one sequence: x @ W.T) OpenBLAS's gemm first copies the whole weight matrix into its
 * packed layout and then multiplies, about three times the memory traffic of a
 * matrix-vector product, which reads each weight once. Preloaded before OpenBLAS (see
 * gemv.py), this library sends one-row products to cblas_sgemv; products of up to
 * MAX_ROWS rows go row by row where the matrix fits in half the last-level cache
 * (SHOAL_GEMV_CACHE_BYTES), so every row after the first reads it from the cache. Every
 * other call goes on to the cblas_sgemm of the library after this one.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111 }; /* CBLAS's values; 112/113 transpose */
enum { MAX_ROWS = 4 };

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                         const float *, int, float, float *, int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *,
                         int, float, float *, int);

static sgemm_fn next_sgemm;
static sgemv_fn next_sgemv;
static double cache_bytes; /* the last-level cache's size; 0: unknown */
unsigned long shoal_gemv_calls; /* products sent to sgemv (the tests read it) */

__attribute__((constructor)) static void find_next(void) {
  next_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
  next_sgemv = (sgemv_fn)dlsym(RTLD_NEXT, "cblas_sgemv");
  const char *size = getenv("SHOAL_GEMV_CACHE_BYTES");
  cache_bytes = size ? atof(size) : 0;
}

static int by_rows(int m, int n, int k) {
  return m == 1 || (m <= MAX_ROWS && 2.0 * n * k * sizeof(float) <= cache_bytes);
}

void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c,
                 int ldc) {
  if (order == ROW_MAJOR && m >= 1 && n > 0 && k > 0 && next_sgemv && by_rows(m, n, k)) {
    /* row i of a: k values 1 apart from a + i*lda, or (a transposed, k x m) lda apart
     * from a + i; row i of c starts at c + i*ldc */
    for (int i = 0; i < m; i++) {
      const float *row = ta == NO_TRANS ? a + (size_t)i * lda : a + i;
      int inc = ta == NO_TRANS ? 1 : lda;
      float *out = c + (size_t)i * ldc;
      if (beta == 0.0f) /* BLAS's rule: c is not read; some gemv versions scale NaN by 0 */
        for (int j = 0; j < n; j++) out[j] = 0.0f;
      if (tb == NO_TRANS) /* b is k x n: c_i = b^T a_i */
        next_sgemv(ROW_MAJOR, 112, k, n, alpha, b, ldb, row, inc, beta, out, 1);
      else /* b is n x k: c_i = b a_i */
        next_sgemv(ROW_MAJOR, NO_TRANS, n, k, alpha, b, ldb, row, inc, beta, out, 1);
    }
    __atomic_fetch_add(&shoal_gemv_calls, m, __ATOMIC_RELAXED);
    return;
  }
  if (!next_sgemm) {
    fputs("shoal gemv_shim: no cblas_sgemm in the libraries after it\n", stderr);
    abort();
  }
  next_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
