/* The native half of the finishes_on_native_thread adversary: write_when_idle writes `words` 32-bit values to `dst` on
   `stream` from a thread Python does not know of, once `stream` has nothing left to run: after the call has returned
   and the device has finished it, ahead of whatever the caller queues next. The writes are one batch of stream memory
   operations (cuStreamBatchMemOp), which leaves no kernel, copy or fill record. The driver is opened at run time, so
   no CUDA header is needed to build this. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef int (*GetContext)(void **);
typedef int (*SetContext)(void *);
typedef int (*QueryStream)(void *);
typedef int (*BatchMemOp)(void *, unsigned int, unsigned long long *, unsigned int);

/* A CUstreamBatchMemOpParams is 48 bytes; a 32-bit write's fields: the operation (2, CU_STREAM_MEM_OP_WRITE_VALUE_32)
   at byte 0, the address at 8, the value at 16, the flags at 24. */
enum { PARAM_WORDS = 6, WRITE_VALUE_32 = 2, BATCH = 256 /* the driver's most per batch */ };

static GetContext get_context;
static SetContext set_context;
static QueryStream query_stream;
static BatchMemOp batch_mem_op;

typedef struct {
  void *context, *stream;
  unsigned long long dst;
  size_t words;
  unsigned int values[];
} Write;

static void *finish(void *arg) {
  Write *write = arg;
  set_context(write->context);
  while (query_stream(write->stream) != 0) { /* CUDA_ERROR_NOT_READY while the call's work runs */
  }
  unsigned long long *params = calloc(write->words * PARAM_WORDS, sizeof(unsigned long long));
  if (params) {
    for (size_t i = 0; i < write->words; i++) {
      params[i * PARAM_WORDS] = WRITE_VALUE_32;
      params[i * PARAM_WORDS + 1] = write->dst + 4 * i;
      params[i * PARAM_WORDS + 2] = write->values[i];
    }
    for (size_t i = 0; i < write->words; i += BATCH) {
      size_t count = write->words - i < BATCH ? write->words - i : BATCH;
      batch_mem_op(write->stream, (unsigned int)count, params + i * PARAM_WORDS, 0);
    }
  }
  free(params);
  free(write);
  return NULL;
}

int write_when_idle(unsigned long long dst, const unsigned int *values, size_t words, unsigned long long stream) {
  if (!batch_mem_op) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) return 1;
    get_context = (GetContext)dlsym(cuda, "cuCtxGetCurrent");
    set_context = (SetContext)dlsym(cuda, "cuCtxSetCurrent");
    query_stream = (QueryStream)dlsym(cuda, "cuStreamQuery");
    batch_mem_op = (BatchMemOp)dlsym(cuda, "cuStreamBatchMemOp_v2");
    if (!get_context || !set_context || !query_stream || !batch_mem_op) return 2;
  }
  Write *write = malloc(sizeof *write + words * sizeof(unsigned int));
  if (!write || get_context(&write->context) != 0) return 3;
  write->stream = (void *)stream;
  write->dst = dst;
  write->words = words;
  memcpy(write->values, values, words * sizeof(unsigned int));
  pthread_t thread;
  if (pthread_create(&thread, NULL, finish, write) != 0) return 4;
  pthread_detach(thread);
  return 0;
}
