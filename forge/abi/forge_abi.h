/* forge kernel ABI (cpu and cuda backends). A candidate includes this header and exports
 *
 *   cpu:  extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out);
 *   cuda: extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out,
 *                                     cudaStream_t stream);
 *
 * `in` and `out` follow the task's inputs and outputs in order. The harness allocates every output
 * (row-major, or channels-last for a 4-d output the model has channels-last: out[j].stride says which) and
 * fills it with NaN before each call: the launcher must write every element.
 * Inputs are read-only. Return 0 on success, non-zero if the launcher cannot handle the shapes.
 * No memory allocation (malloc/new/cudaMalloc), no other streams or threads than OpenMP (cpu) and the
 * given stream (cuda), no files, environment, processes or timers: the static checks reject these.
 */
#ifndef FORGE_ABI_H
#define FORGE_ABI_H
#include <stdint.h>

enum ForgeDtype {
  FORGE_FLOAT32 = 0,
  FORGE_FLOAT16 = 1,
  FORGE_BFLOAT16 = 2,
  FORGE_FLOAT64 = 3,
  FORGE_INT64 = 4,
  FORGE_INT32 = 5,
  FORGE_INT8 = 6,
  FORGE_UINT8 = 7,
  FORGE_BOOL = 8,
};

typedef struct {
  void* data;             /* host pointer (cpu) or device pointer (cuda) */
  int32_t dtype;          /* a ForgeDtype */
  int32_t ndim;
  const int64_t* shape;   /* ndim sizes */
  const int64_t* stride;  /* ndim strides, in elements */
} ForgeTensor;

#endif
