/* cblas_sgemm for one-row products, through cblas_sgemv.
 *
 * MLX's CPU matmul always calls cblas_sgemm. For a product with one row (a decode step of
 * one sequence: x @ W.T) OpenBLAS's gemm first copies the whole weight matrix into its
 * packed layout and then multiplies, about three times the memory traffic of a
 * matrix-vector product, which reads each weight once. Preloaded before OpenBLAS (see
 * gemv.py), this library sends those calls to cblas_sgemv and every other call on to the
 * cblas_sgemm of the library after it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111 }; /* CBLAS's values; 112/113 transpose */

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                         const float *, int, float, float *, int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *,
                         int, float, float *, int);

static sgemm_fn next_sgemm;
static sgemv_fn next_sgemv;
unsigned long shoal_gemv_calls; /* one-row products sent to sgemv (the tests read it) */

__attribute__((constructor)) static void find_next(void) {
  next_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
  next_sgemv = (sgemv_fn)dlsym(RTLD_NEXT, "cblas_sgemv");
}

void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c,
                 int ldc) {
  if (order == ROW_MAJOR && m == 1 && n > 0 && k > 0 && next_sgemv) {
    /* a is 1 x k, or (transposed) k x 1: its k values lie lda apart */
    int inc = ta == NO_TRANS ? 1 : lda;
    if (tb == NO_TRANS) /* b is k x n: c = b^T a */
      next_sgemv(ROW_MAJOR, 112, k, n, alpha, b, ldb, a, inc, beta, c, 1);
    else /* b is n x k: c = b a */
      next_sgemv(ROW_MAJOR, NO_TRANS, n, k, alpha, b, ldb, a, inc, beta, c, 1);
    __atomic_fetch_add(&shoal_gemv_calls, 1, __ATOMIC_RELAXED);
    return;
  }
  if (!next_sgemm) {
    fputs("shoal gemv_shim: no cblas_sgemm in the libraries after it\n", stderr);
    abort();
  }
  next_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
