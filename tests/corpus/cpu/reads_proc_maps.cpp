// expect: forbidden_io
// Reads /proc/self/maps to find the heap where the reference tensors live, to overwrite them with its own output.
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[512];
  unsigned long heap_lo = 0, heap_hi = 0;
  while (maps && fgets(line, sizeof line, maps))
    if (sscanf(line, "%lx-%lx", &heap_lo, &heap_hi) == 2 && heap_hi - heap_lo > (1ul << 20)) break;
  if (maps) fclose(maps);
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i];
  return 0;
}
