// The fused operators' small GEMMs (the DNC's recurrence, the GRU sequence): MKL's sgemm_ and
// dgemm_ called directly on raw pointers where torch carries MKL, at::addmm_ otherwise.
// Included by path from each operator's source, as vector_math.h.

#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#if defined(__linux__) || defined(__APPLE__)
#include <dlfcn.h>
#endif

namespace relmem_blas {

using at::Tensor;

// A recurrence's per-step GEMMs are small (a batch of 8 to 32 rows against a controller's
// weights); through ATen each pays a dispatch, a few tensor views and its checks, several
// microseconds, which at the copy preset's sizes was a fifth of the whole step. When torch
// carries MKL (at::hasMKL(): its x86 builds), its Fortran entry points sgemm_/dgemm_ in the
// library that holds ATen (LP64, as torch links them) are called directly on the loop's
// pointers; otherwise, or with
// RELMEM_DNC_ATEN_GEMM=1 in the environment (what the tests use to run this path), the same
// product goes through at::addmm_.

template <typename T>
using BlasGemm = void (*)(const char*, const char*, const int*, const int*, const int*, const T*,
                          const T*, const int*, const T*, const int*, const T*, T*, const int*);

template <typename T>
BlasGemm<T> find_blas_gemm() {
#if defined(__linux__) || defined(__APPLE__)
  const char* aten = std::getenv("RELMEM_DNC_ATEN_GEMM");
  if ((aten && std::strcmp(aten, "1") == 0) || !at::hasMKL()) return nullptr;
  // the library that holds ATen (and, linked into it, MKL), not whichever sgemm_ came first
  Dl_info info;
  if (!dladdr(reinterpret_cast<void*>(&at::globalContext), &info) || !info.dli_fname) {
    return nullptr;
  }
  void* library = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (!library) return nullptr;
  const char* name = std::is_same_v<T, float> ? "sgemm_" : "dgemm_";
  return reinterpret_cast<BlasGemm<T>>(dlsym(library, name));
#else
  return nullptr;
#endif
}

template <typename T>
BlasGemm<T> blas_gemm() {
  static const BlasGemm<T> found = find_blas_gemm<T>();
  return found;
}

// C = beta·C + A·op(B), row-major: A [m, k] with row stride lda; B [n, k] (tb: C = A Bᵀ, as a
// Linear's weight) or [k, n], row stride ldb; C [m, n], row stride ldc. beta 0 ignores C.
template <typename T>
void gemm(bool tb, int64_t m, int64_t n, int64_t k, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc) {
  const BlasGemm<T> blas = blas_gemm<T>();
  const int64_t largest = std::max({m, n, k, lda, ldb, ldc});
  if (blas && largest < INT_MAX) {
    // row-major C = A op(B) is column-major Cᵀ = op(B)ᵀ Aᵀ
    const char transb = tb ? 'T' : 'N', transa = 'N';
    const int mi = int(n), ni = int(m), ki = int(k), la = int(ldb), lb = int(lda), lc = int(ldc);
    const T one = 1;
    blas(&transb, &transa, &mi, &ni, &ki, &one, B, &la, A, &lb, &beta, C, &lc);
    return;
  }
  const auto options = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  const Tensor a = at::from_blob(const_cast<T*>(A), {m, k}, {lda, 1}, options);
  const Tensor b = tb ? at::from_blob(const_cast<T*>(B), {n, k}, {ldb, 1}, options).t()
                      : at::from_blob(const_cast<T*>(B), {k, n}, {ldb, 1}, options);
  at::from_blob(C, {m, n}, {ldc, 1}, options).addmm_(a, b, beta, 1);
}

}  // namespace relmem_blas
