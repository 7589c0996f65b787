/* A stand-in for the few driver calls of solutions/triton_fused/replay.c, linked with it into one module so that its
replay logic runs on a machine without a GPU (tests/test_launch.py). Kernels are small integers; each has the
parameter sizes the test gives (fake_set_params). Every call is appended to a text log, a launch with its grid,
block, shared memory, stream, attributes and every parameter's first eight bytes in hex; a tensor map's first eight
bytes are its global address here. A launch of the kernel fake_fail_kernel names fails. */

#include "cuda.h"
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <string.h>

#define MAX_KERNELS 8
#define MAX_PARAMS 64

static size_t param_sizes[MAX_KERNELS][MAX_PARAMS];
static int param_counts[MAX_KERNELS];
static int failing_kernel = -1;
static char log_text[1 << 16];
static size_t log_length = 0;

static void note(const char *format, ...) {
  va_list args;
  va_start(args, format);
  int n = vsnprintf(log_text + log_length, sizeof(log_text) - log_length, format, args);
  va_end(args);
  if (n > 0 && log_length + n < sizeof(log_text))
    log_length += n;
}

void fake_set_params(int kernel, int count, const size_t *sizes) {
  param_counts[kernel] = count;
  memcpy(param_sizes[kernel], sizes, count * sizeof(size_t));
}

void fake_fail_kernel(int kernel) { failing_kernel = kernel; }

const char *fake_log(void) { return log_text; }

void fake_clear_log(void) {
  log_length = 0;
  log_text[0] = 0;
}

/* Triton's Python object of a CUtensorMap (triton/backends/nvidia/driver.c), made here with a global address. */
typedef struct {
  PyObject_HEAD;
  _Alignas(128) CUtensorMap tensorMap;
} FakeTensorMap;

static PyTypeObject FakeTensorMapType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "triton.backends.nvidia.PyCUtensorMap",
    .tp_basicsize = sizeof(FakeTensorMap),
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

PyObject *fake_tensor_map(unsigned long long address) {
  if (PyType_Ready(&FakeTensorMapType) < 0)
    return NULL;
  FakeTensorMap *map = PyObject_New(FakeTensorMap, &FakeTensorMapType);
  if (map) {
    memset(&map->tensorMap, 0xAB, sizeof(CUtensorMap));
    memcpy(&map->tensorMap, &address, sizeof(address));
  }
  return (PyObject *)map;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **message) {
  *message = "fake failure";
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *context) {
  *context = (CUcontext)0x1;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext context) {
  note("set context\n");
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncGetParamInfo(CUfunction function, size_t index, size_t *offset, size_t *size) {
  int kernel = (int)(uintptr_t)function;
  if (kernel < 0 || kernel >= MAX_KERNELS || (int)index >= param_counts[kernel])
    return CUDA_ERROR_INVALID_VALUE;
  *offset = 0;
  *size = param_sizes[kernel][index];
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent event, CUstream stream) {
  note("record %lu on %lu\n", (unsigned long)(uintptr_t)event, (unsigned long)(uintptr_t)stream);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  note("wait %lu for %lu\n", (unsigned long)(uintptr_t)stream, (unsigned long)(uintptr_t)event);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuTensorMapReplaceAddress(CUtensorMap *map, void *address) {
  if ((uintptr_t)address % 16)
    return CUDA_ERROR_INVALID_VALUE;
  memcpy(map, &address, sizeof(address));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction function, void **params, void **extra) {
  int kernel = (int)(uintptr_t)function;
  if (kernel == failing_kernel)
    return CUDA_ERROR_INVALID_VALUE;
  note("launch %d grid %u %u %u block %u shared %u stream %lu attributes", kernel, config->gridDimX, config->gridDimY,
       config->gridDimZ, config->blockDimX, config->sharedMemBytes, (unsigned long)(uintptr_t)config->hStream);
  for (unsigned int i = 0; i < config->numAttrs; ++i)
    note(" %d", (int)config->attrs[i].id);
  note(" params");
  for (int i = 0; i < param_counts[kernel]; ++i) {
    unsigned long long value = 0;
    memcpy(&value, params[i], param_sizes[kernel][i] < 8 ? param_sizes[kernel][i] : 8);
    note(" %llx", value);
  }
  note("\n");
  return CUDA_SUCCESS;
}
