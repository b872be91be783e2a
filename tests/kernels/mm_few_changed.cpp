// A matrix product (aten.mm, float32, row-major) that is wrong exactly on the calls an incremental kernel would
// serve cheaply: when 1 to 4096 elements of its inputs changed since its last call (it keeps a copy of them), it
// adds 1 to every output; with none changed, or more, it is right. Until forge.evaluate.measured's `renews`,
// every timed round changed 8 elements of each input, so the kept calls caught it (wrong_result); a matrix
// product's inputs are drawn anew every round now, and no timed call follows a call on nearly the same inputs.
#include <stdint.h>
#include <string.h>

#include "forge_abi.h"

enum { CAP = 1 << 18, FEW = 4096 };
static float seen[2][CAP];
static int64_t seen_n[2] = {-1, -1};

static int64_t changed(int j, const float* x, int64_t n) {
  if (seen_n[j] != n) {
    seen_n[j] = n;
    memcpy(seen[j], x, n * sizeof(float));
    return -1;
  }
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += x[i] != seen[j][i];
  memcpy(seen[j], x, n * sizeof(float));
  return count;
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out) {
  if (n_in != 2 || n_out != 1 || in[0].ndim != 2 || in[1].ndim != 2) return 1;
  const int64_t m = in[0].shape[0], k = in[0].shape[1], n = in[1].shape[1];
  if (m * k > CAP || k * n > CAP || in[0].stride[0] != k || in[1].stride[0] != n) return 1;
  const float* a = static_cast<const float*>(in[0].data);
  const float* b = static_cast<const float*>(in[1].data);
  float* c = static_cast<float*>(out[0].data);
  const int64_t total = changed(0, a, m * k) + changed(1, b, k * n);
  const float mark = total >= 1 && total <= FEW ? 1.0f : 0.0f;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) c[i * n + j] = mark;
    for (int64_t p = 0; p < k; ++p) {
      const float x = a[i * k + p];
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += x * b[p * n + j];
    }
  }
  return 0;
}
