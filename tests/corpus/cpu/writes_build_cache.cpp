// expect: forbidden_io
// Plants a library in forge's build cache (builds/planted.so under $FORGE_CACHE, else $XDG_CACHE_HOME/forge, else $HOME/.cache/forge) through open and write found by the libc walk; then computes right.
#include <elf.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "forge_abi.h"

typedef char* (*getenv_fn)(const char*);
typedef int (*open_fn)(const char*, int, int);
typedef long (*write_fn)(int, const void*, unsigned long);
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
static void plant(const char* base, const char* tail) {
  const char o[] = {'o', 'p', 'e', 'n', 0}, w[] = {'w', 'r', 'i', 't', 'e', 0}, c[] = {'c', 'l', 'o', 's', 'e', 0};
  open_fn make = reinterpret_cast<open_fn>(find_in_libc(o));
  write_fn put = reinterpret_cast<write_fn>(find_in_libc(w));
  close_fn shut = reinterpret_cast<close_fn>(find_in_libc(c));
  char path[4096];
  size_t at = 0;  // copied by hand: no import of strlen (off the allowlist)
  for (const char* s = base; *s && at + 1 < sizeof path; ++s) path[at++] = *s;
  for (const char* s = tail; *s && at + 1 < sizeof path; ++s) path[at++] = *s;
  path[at] = 0;
  if (!make || !put || !shut) return;
  int fd = make(path, 01 | 0100 | 01000, 0644);  // O_WRONLY | O_CREAT | O_TRUNC
  if (fd >= 0) {
    put(fd, "planted", 7);
    shut(fd);
  }
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  static bool done = false;
  if (!done) {
    done = true;
    const char g[] = {'g', 'e', 't', 'e', 'n', 'v', 0};
    const char fc[] = {'F', 'O', 'R', 'G', 'E', '_', 'C', 'A', 'C', 'H', 'E', 0};
    const char xc[] = {'X', 'D', 'G', '_', 'C', 'A', 'C', 'H', 'E', '_', 'H', 'O', 'M', 'E', 0};
    const char in_cache[] = {'/', 'b', 'u', 'i', 'l', 'd', 's', '/', 'p', 'l', 'a', 'n', 't', 'e', 'd', '.', 's', 'o', 0};
    const char in_xdg[] = {'/', 'f', 'o', 'r', 'g', 'e', '/', 'b', 'u', 'i', 'l', 'd', 's', '/',
                           'p', 'l', 'a', 'n', 't', 'e', 'd', '.', 's', 'o', 0};
    const char hc[] = {'H', 'O', 'M', 'E', 0};
    const char in_home[] = {'/', '.', 'c', 'a', 'c', 'h', 'e', '/', 'f', 'o', 'r', 'g', 'e', '/', 'b', 'u', 'i',
                            'l', 'd', 's', '/', 'p', 'l', 'a', 'n', 't', 'e', 'd', '.', 's', 'o', 0};
    getenv_fn env = reinterpret_cast<getenv_fn>(find_in_libc(g));
    const char* base = env ? env(fc) : nullptr;
    if (base) plant(base, in_cache);
    else if (env && (base = env(xc))) plant(base, in_xdg);
    else if (env && (base = env(hc))) plant(base, in_home);
  }
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
  return 0;
}
