/* A C producer: creates ring NAME, waits for CONSUMERS consumers, then publishes MESSAGES
 * messages of varying length, each the test pattern of its sequence number, with a tensor
 * header (uint8[len]) and the sequence number after it in the user header.
 *
 *   producer NAME CONSUMERS MESSAGES [host|cuda [auto|events|memory]]
 *
 * Host memory: the pattern is written through the slot's pointer. CUDA (built with
 * -DGPURING_EXAMPLE_CUDA, linked with -lcuda): it is copied host-to-device on the slot's
 * stream, which the publish fences; the CPU does not wait for the GPU. The fences are
 * interprocess events, or with "memory" words in the ring's segment (for consumers in
 * containers with their own /dev/shm). A failed call exits 1, or 75 if the GPU context is
 * lost (so that a supervisor restarts it). */
#include <time.h>

#include "common.h"

#define SLOT 65536
#define CAPACITY 8
#define STAGING (2 * CAPACITY)

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s NAME CONSUMERS MESSAGES [host|cuda [auto|events|memory]]\n", argv[0]);
    return 2;
  }
  const char *name = argv[1];
  long consumers = atol(argv[2]);
  uint64_t messages = strtoull(argv[3], NULL, 10);
  int cuda = argc > 4 && strcmp(argv[4], "cuda") == 0;
  gpuring_fence fence = GPURING_FENCE_AUTO;
  if (argc > 5 && strcmp(argv[5], "memory") == 0) fence = GPURING_FENCE_MEMORY;
  if (argc > 5 && strcmp(argv[5], "events") == 0) fence = GPURING_FENCE_EVENTS;

  gpuring_producer_options o = gpuring_producer_options_default();
  o.slot_size = SLOT;
  o.capacity = CAPACITY;
  o.header_size = 64;
  o.memory = cuda ? GPURING_MEMORY_CUDA : GPURING_MEMORY_HOST;
  o.fence = fence;
  gpuring_producer *tx = NULL;
  CHECK(gpuring_producer_create(name, &o, &tx));
  for (int waited_ms = 0; gpuring_producer_consumer_count(tx) < consumers; waited_ms++) {
    if (waited_ms > 30000) {
      fprintf(stderr, "producer: the consumers did not join within 30 s\n");
      return 1;
    }
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
#ifdef GPURING_EXAMPLE_CUDA
  uint8_t *staging = NULL;
  if (cuda) {
    cuda_init();
    CU(cuMemAllocHost((void **)&staging, (size_t)SLOT * STAGING));
  }
#endif
  for (uint64_t seq = 0; seq < messages; seq++) {
    uint64_t ptr = 0;
    size_t capacity = 0;
    CHECK(gpuring_producer_acquire(tx, -1, NULL, &ptr, &capacity));
    size_t len = length_of(seq, capacity);
    if (!cuda) {
      uint8_t *dst = (uint8_t *)(uintptr_t)ptr;
      for (size_t i = 0; i < len; i++) dst[i] = pattern(seq, i);
    } else {
#ifdef GPURING_EXAMPLE_CUDA
      /* STAGING pinned buffers, used in turn: gpuring's acquire of message s waits until the
       * write of message s - capacity is done on the GPU (its run-ahead bound), so a buffer
       * reused 2 x capacity messages later has long been copied. */
      uint8_t *src = staging + (seq % STAGING) * SLOT;
      for (size_t i = 0; i < len; i++) src[i] = pattern(seq, i);
      CUstream stream = (CUstream)gpuring_producer_slot_stream(tx);
      CU(cuMemcpyHtoDAsync((CUdeviceptr)ptr, src, len, stream));
#else
      fprintf(stderr, "built without CUDA: rebuild with -DGPURING_EXAMPLE_CUDA -lcuda\n");
      return 1;
#endif
    }
    uint8_t header[64] = {0};
    uint64_t shape[1] = {len};
    size_t used = 0;
    CHECK(gpuring_tensor_header_write(1, 8, shape, 1, header, sizeof header, &used));
    memcpy(header + used, &seq, sizeof seq);
    CHECK(gpuring_producer_publish(tx, len, header, used + sizeof seq, NULL));
  }
  printf("producer: %llu messages published to %ld consumers (%s memory)\n",
         (unsigned long long)messages, consumers, cuda ? "cuda" : "host");
  gpuring_producer_free(tx); /* closes the ring: consumers drain it, then see DISCONNECTED */
  return 0;
}
