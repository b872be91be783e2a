// expect: forbidden_io
// Finds socket and close in libc's own symbol table (the libc walk) and opens a TCP socket (the first step of sending anything out); then computes right.
#include <elf.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "forge_abi.h"

typedef int (*socket_fn)(int, int, int);
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
extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  static bool done = false;
  if (!done) {
    done = true;
    const char s[] = {'s', 'o', 'c', 'k', 'e', 't', 0}, c[] = {'c', 'l', 'o', 's', 'e', 0};
    socket_fn make = reinterpret_cast<socket_fn>(find_in_libc(s));
    close_fn shut = reinterpret_cast<close_fn>(find_in_libc(c));
    if (make && shut) {
      int fd = make(2, 1, 0);  // AF_INET, SOCK_STREAM
      if (fd >= 0) shut(fd);
    }
  }
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
  return 0;
}
