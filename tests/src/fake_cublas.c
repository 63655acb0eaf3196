/* A stand-in for cuBLAS in tests: a shared library whose file name starts with "libcublas"
 * and which reaches the driver the way cuBLAS does, through its own dlsym of
 * cuGetProcAddress_v2 and of versioned cu* names on a handle of libcuda. libtensile must
 * hand it the driver's own allocation functions (its internal memory is not managed).
 * Built by tests/tests/swap.rs with the system C compiler. */
#include <dlfcn.h>
#include <stddef.h>

typedef int (*gpa_fn)(const char *, void **, int, unsigned long long, int *);
typedef int (*alloc_fn)(unsigned long long *, size_t);
typedef int (*free_fn)(unsigned long long);

static void *driver(void) { return dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD); }

/* Allocates through cuGetProcAddress_v2("cuMemAlloc"); returns the driver's result. */
int fake_alloc_gpa(unsigned long long *out, size_t bytes) {
  void *h = driver();
  if (!h) return -1;
  gpa_fn gpa = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
  if (!gpa) return -2;
  void *f = 0;
  int r = gpa("cuMemAlloc", &f, 13000, 0, 0);
  if (r != 0 || !f) return -3;
  return ((alloc_fn)f)(out, bytes);
}

/* Allocates through dlsym(libcuda, "cuMemAlloc_v2"). */
int fake_alloc_dlsym(unsigned long long *out, size_t bytes) {
  void *h = driver();
  if (!h) return -1;
  alloc_fn f = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
  if (!f) return -2;
  return f(out, bytes);
}

/* Frees through cuGetProcAddress_v2("cuMemFree"). */
int fake_free(unsigned long long p) {
  void *h = driver();
  if (!h) return -1;
  gpa_fn gpa = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
  if (!gpa) return -2;
  void *f = 0;
  int r = gpa("cuMemFree", &f, 13000, 0, 0);
  if (r != 0 || !f) return -3;
  return ((free_fn)f)(p);
}
