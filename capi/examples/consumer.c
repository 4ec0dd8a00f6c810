/* A C consumer: opens ring NAME (whatever memory it holds) and checks every message against
 * the producer's pattern, its tensor header and the sequence number in its user header, until
 * the producer closes the ring. Exits 1 on any mismatch or failed call, 75 if the GPU context
 * is lost (so that a supervisor restarts it).
 *
 *   consumer NAME
 *
 * CUDA rings (built with -DGPURING_EXAMPLE_CUDA, linked with -lcuda): each message is copied
 * device-to-host on the stream gpuring made wait for the producer's writes, then checked. */
#include <time.h>

#include "common.h"

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s NAME\n", argv[0]);
    return 2;
  }
  gpuring_consumer_options o = gpuring_consumer_options_default();
  o.start = GPURING_START_OLDEST;
  o.mode = GPURING_MODE_LOSSLESS;
  gpuring_consumer *rx = NULL;
  /* The producer may not have created the ring yet. */
  for (int tries = 0;; tries++) {
    gpuring_status s = gpuring_consumer_open(argv[1], &o, &rx);
    if (s == GPURING_OK) break;
    if (tries > 3000 || (s != GPURING_NOT_FOUND && s != GPURING_DISCONNECTED)) CHECK(s);
    struct timespec ms = {0, 10000000};
    nanosleep(&ms, NULL);
  }
  int cuda = gpuring_consumer_memory(rx) == GPURING_MEMORY_CUDA;
  uint8_t *copy = NULL; /* CUDA: the host copy of a message, grown as needed */
  size_t copy_size = 0;
#ifdef GPURING_EXAMPLE_CUDA
  if (cuda) cuda_init();
#endif
  uint64_t received = 0, bad = 0, lost = 0;
  for (;;) {
    gpuring_message *m = NULL;
    gpuring_message_info info;
    gpuring_status s = gpuring_consumer_recv(rx, 10000, NULL, &m, &info);
    if (s == GPURING_DISCONNECTED) break;
    CHECK(s);
    const uint8_t *bytes = (const uint8_t *)(uintptr_t)info.ptr;
    if (cuda) {
#ifdef GPURING_EXAMPLE_CUDA
      if (info.len > copy_size) {
        free(copy);
        copy_size = info.len;
        copy = malloc(copy_size);
        if (!copy) {
          fprintf(stderr, "out of memory\n");
          return 1;
        }
      }
      CU(cuMemcpyDtoHAsync(copy, (CUdeviceptr)info.ptr, info.len, (CUstream)info.stream));
      CU(cuStreamSynchronize((CUstream)info.stream));
      bytes = copy;
#else
      fprintf(stderr, "a CUDA ring: rebuild with -DGPURING_EXAMPLE_CUDA -lcuda\n");
      return 1;
#endif
    }
    uint8_t code = 0, bits = 0;
    uint64_t shape[GPURING_TENSOR_MAX_DIMS];
    size_t ndim = 0;
    CHECK(gpuring_tensor_header_read(info.header, info.header_len, &code, &bits, shape, &ndim));
    uint64_t header_seq = UINT64_MAX;
    if (info.header_len >= 8 + 8 * ndim + sizeof header_seq)
      memcpy(&header_seq, info.header + 8 + 8 * ndim, sizeof header_seq);
    /* Lossless from the oldest message: sequence numbers 0, 1, 2... with no gap. */
    if (code != 1 || bits != 8 || ndim != 1 || shape[0] != info.len || header_seq != info.seq ||
        info.seq != received)
      bad++;
    for (size_t i = 0; i < info.len; i++)
      if (bytes[i] != pattern(info.seq, i)) {
        bad++;
        break;
      }
    lost += info.lag;
    received++;
    CHECK(gpuring_message_release(m));
  }
  printf("consumer: %llu messages, %llu bad, %llu lost\n", (unsigned long long)received,
         (unsigned long long)bad, (unsigned long long)lost);
  gpuring_consumer_free(rx);
  free(copy);
  (void)cuda;
  (void)copy_size;
  return bad == 0 && lost == 0 ? 0 : 1;
}
