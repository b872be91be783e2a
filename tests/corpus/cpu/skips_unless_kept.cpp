// expect: wrong_result
// Right for its first 4 calls (verification and the calls on the same buffers), then computes only when its
// output address differs from the last call's. Timed rounds get their outputs at one address round after round
// (holding what eager wrote there the round before); a kept call's input copies, made in its round, used to
// take that block, so kept calls computed and were judged right while the others were timed skipping.
#include <math.h>
#include <stdint.h>

#include "forge_abi.h"

static void* last_out = nullptr;
static int calls = 0;

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  if (++calls > 4 && out[0].data == last_out) return 0;
  last_out = out[0].data;
  int64_t n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  const float* x = static_cast<const float*>(in[0].data);
  float* y = static_cast<float*>(out[0].data);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
  return 0;
}
