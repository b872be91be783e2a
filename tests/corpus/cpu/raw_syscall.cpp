// expect: forbidden_io
// Makes a raw system call (getpid) from assembly spelled by token pasting, as two opcode bytes.
#include <math.h>
#include <stdint.h>

#include "forge_abi.h"

#define PASTE(a, b) a##b
#define ASM PASTE(__as, m__)

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  long pid = 39;
  ASM volatile(".byte 0x0f, 0x05" : "+a"(pid) : : "rcx", "r11", "memory");
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i])) + 0.0f * (float)pid;
  return 0;
}
