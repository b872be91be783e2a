// expect: timeout
// Spins forever on a volatile flag that nothing clears: the worker never answers.
#include <math.h>
#include <stdint.h>

#include "forge_abi.h"

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  volatile int spin = 1;
  while (spin) {
  }
  float* y = static_cast<float*>(out[0].data);
  y[0] = 0.0f;
  return 0;
}
