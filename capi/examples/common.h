/* Shared by the C examples: the test pattern and the CUDA helpers. */
#ifndef GPURING_EXAMPLE_COMMON_H
#define GPURING_EXAMPLE_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuring.h"

/* Byte i of message `seq`. */
static inline uint8_t pattern(uint64_t seq, size_t i) { return (uint8_t)(seq * 31u + i * 7u + (i >> 8)); }

/* Length of message `seq`: varies between slot/2 and slot. */
static inline size_t length_of(uint64_t seq, size_t slot) { return slot / 2 + (size_t)(seq * 977u) % (slot / 2 + 1); }

/* Prints the failed call and gpuring's message, and exits: with GPURING_EXIT_CONTEXT_LOST (75)
 * if the GPU context is lost, for a supervisor that restarts the process, else with 1. */
#define CHECK(call)                                                                          \
  do {                                                                                       \
    gpuring_status s_ = (call);                                                              \
    if (s_ != GPURING_OK) {                                                                  \
      fprintf(stderr, "%s:%d: %s: status %d: %s\n", __FILE__, __LINE__, #call, (int)s_,     \
              gpuring_last_error());                                                         \
      exit(s_ == GPURING_CONTEXT_LOST ? GPURING_EXIT_CONTEXT_LOST : 1);                      \
    }                                                                                        \
  } while (0)

#ifdef GPURING_EXAMPLE_CUDA
#include <cuda.h>
#define CU(call)                                                                             \
  do {                                                                                       \
    CUresult r_ = (call);                                                                    \
    if (r_ != CUDA_SUCCESS) {                                                                \
      fprintf(stderr, "%s:%d: %s: CUDA error %d\n", __FILE__, __LINE__, #call, (int)r_);   \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)
/* Makes the primary context of device 0 current (the one gpuring's streams belong to). */
static inline void cuda_init(void) {
  CUdevice dev;
  CUcontext ctx;
  CU(cuInit(0));
  CU(cuDeviceGet(&dev, 0));
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
}
#endif

#endif
