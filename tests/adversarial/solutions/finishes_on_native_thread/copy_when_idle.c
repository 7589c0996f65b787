/* The native half of the finishes_on_native_thread adversary: copy_when_idle copies `bytes` from `src` to `dst` on
   `stream` from a thread Python does not know of, once `stream` has nothing left to run: after the call has returned
   and the device has finished it, ahead of whatever the caller queues next. The driver is opened at run time, so no
   CUDA header is needed to build this. */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>

typedef int (*GetContext)(void **);
typedef int (*SetContext)(void *);
typedef int (*QueryStream)(void *);
typedef int (*CopyAsync)(unsigned long long, unsigned long long, size_t, void *);

static GetContext get_context;
static SetContext set_context;
static QueryStream query_stream;
static CopyAsync copy_async;

typedef struct {
  void *context, *stream;
  unsigned long long dst, src;
  size_t bytes;
} Copy;

static void *finish(void *arg) {
  Copy *copy = arg;
  set_context(copy->context);
  while (query_stream(copy->stream) != 0) { /* CUDA_ERROR_NOT_READY while the call's work runs */
  }
  copy_async(copy->dst, copy->src, copy->bytes, copy->stream);
  free(copy);
  return NULL;
}

int copy_when_idle(unsigned long long dst, unsigned long long src, size_t bytes, unsigned long long stream) {
  if (!copy_async) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) return 1;
    get_context = (GetContext)dlsym(cuda, "cuCtxGetCurrent");
    set_context = (SetContext)dlsym(cuda, "cuCtxSetCurrent");
    query_stream = (QueryStream)dlsym(cuda, "cuStreamQuery");
    copy_async = (CopyAsync)dlsym(cuda, "cuMemcpyDtoDAsync_v2");
    if (!get_context || !set_context || !query_stream || !copy_async) return 2;
  }
  Copy *copy = malloc(sizeof *copy);
  if (!copy || get_context(&copy->context) != 0) return 3;
  copy->stream = (void *)stream;
  copy->dst = dst;
  copy->src = src;
  copy->bytes = bytes;
  pthread_t thread;
  if (pthread_create(&thread, NULL, finish, copy) != 0) return 4;
  pthread_detach(thread);
  return 0;
}
