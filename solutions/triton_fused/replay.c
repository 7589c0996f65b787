/* A call context's launches, event records and stream waits, replayed by one call from Python (native.py).

A replay first checks that the call's tensors have the dtypes, shapes, strides and 16-byte alignment of the recorded
call's, on which the kernels were specialised and the launcher decided, and launches nothing where one differs: the
check costs a few attribute reads per tensor in C, which is what lets a caller skip building a Python key for the
context of every call (solution.backward).

Each launch keeps its kernel, launch configuration and every parameter's bytes as its context's first call passed
them; a replay writes the call's tensors' addresses into the parameters that held the first call's (pointers, and
the global address of the TMA descriptors over them, through cuTensorMapReplaceAddress) and issues every operation
with the driver's own calls. Triton's launcher does the same per launch, from Python objects, which is where most
of its host time goes: parsing thirty-odd arguments, asking the driver about every pointer, encoding every
descriptor from scratch.

The launch configuration follows Triton's (third_party/nvidia/backend/driver.py, `_launch`): 32 threads per warp,
the grid's x times the cluster's CTAs, a cluster of num_ctas along x with the spread scheduling policy, and the
programmatic-dependent-launch and cooperative attributes where the kernel asks for them. */

#include "cuda.h"
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

enum { LAUNCH, RECORD, WAIT };

/* A parameter that takes one of the call's tensors: its address, or a descriptor over it. */
typedef struct {
  int param;
  int tensor;
} Patch;

typedef struct {
  int kind;
  CUstream stream;
  CUevent event; /* RECORD, WAIT */
  /* LAUNCH */
  CUfunction function;
  CUlaunchConfig config;
  CUlaunchAttribute attributes[4];
  int empty;          /* a grid of no programs: nothing to launch, as in Triton */
  char *storage;      /* every parameter's bytes, each at a multiple of 128 */
  void **params;      /* the parameters' addresses in storage, as cuLaunchKernelEx takes them */
  Patch *pointers;    /* parameters that hold a call tensor's address */
  Py_ssize_t n_pointers;
  Patch *maps;        /* TMA descriptors over a call tensor */
  Py_ssize_t n_maps;
} Operation;

/* A call tensor as the recorded call had it. */
enum { MAX_DIMS = 8 };
typedef struct {
  PyObject *dtype; /* torch's dtype objects are singletons: compared by identity */
  Py_ssize_t ndim;
  long long sizes[MAX_DIMS], strides[MAX_DIMS];
  unsigned long long alignment; /* the address modulo 16 */
} Layout;

typedef struct {
  CUcontext context;
  Py_ssize_t n_tensors;
  Layout *layouts; /* n_tensors */
  Operation *ops;
  Py_ssize_t n_ops, capacity;
} Program;

/* Triton's Python object of a CUtensorMap (driver.c, PyCUtensorMapObject), read where the first call's descriptors
   are copied; its type's name and size are checked first. */
typedef struct {
  PyObject_HEAD;
  _Alignas(128) CUtensorMap tensorMap;
} TritonTensorMap;

static PyObject *data_ptr_name = NULL, *dtype_name = NULL, *shape_name = NULL, *stride_name = NULL;

static int check(CUresult result, const char *what) {
  if (result == CUDA_SUCCESS)
    return 1;
  const char *message = NULL;
  cuGetErrorString(result, &message);
  PyErr_Format(PyExc_RuntimeError, "%s failed: %s", what, message ? message : "unknown CUDA error");
  return 0;
}

static void free_operation(Operation *op) {
  free(op->storage);
  free(op->params);
  free(op->pointers);
  free(op->maps);
}

/* Frees a program, whole or half-built (new_program's error path: no operations, layouts read so far). */
static void destroy(Program *program) {
  for (Py_ssize_t i = 0; i < program->n_ops; ++i)
    free_operation(&program->ops[i]);
  for (Py_ssize_t i = 0; program->layouts && i < program->n_tensors; ++i)
    Py_XDECREF(program->layouts[i].dtype);
  free(program->layouts);
  free(program->ops);
  free(program);
}

static void free_program(PyObject *capsule) {
  Program *program = PyCapsule_GetPointer(capsule, "triton_fused.Program");
  if (program)
    destroy(program);
}

/* Reads a shape or strides (a sequence of ints) into `into`; 0 with an exception set if it is not one of at most
   MAX_DIMS. */
static int read_ints(PyObject *sequence, long long *into, Py_ssize_t *n) {
  PyObject *fast = PySequence_Fast(sequence, "a shape and strides must be sequences of ints");
  if (!fast)
    return 0;
  *n = PySequence_Fast_GET_SIZE(fast);
  int ok = *n <= MAX_DIMS;
  if (!ok)
    PyErr_Format(PyExc_ValueError, "a tensor of %zd dimensions (at most %d)", *n, (int)MAX_DIMS);
  for (Py_ssize_t i = 0; ok && i < *n; ++i) {
    into[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    ok = !(into[i] == -1 && PyErr_Occurred());
  }
  Py_DECREF(fast);
  return ok;
}

/* Whether `sequence` (a torch.Size or a tuple of strides) holds the n ints of `expected`: 1, 0, or -1 on an error. */
static int same_ints(PyObject *sequence, const long long *expected, Py_ssize_t n) {
  if (!PyTuple_Check(sequence)) {
    PyErr_SetString(PyExc_TypeError, "a tensor's shape and strides must be tuples");
    return -1;
  }
  if (PyTuple_GET_SIZE(sequence) != n)
    return 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    long long value = PyLong_AsLongLong(PyTuple_GET_ITEM(sequence, i));
    if (value == -1 && PyErr_Occurred())
      return -1;
    if (value != expected[i])
      return 0;
  }
  return 1;
}

/* Reads the call's tensors' addresses into `addresses`: 1 where every tensor has its recorded layout, 0 where one
   does not, -1 on an error. */
static int read_call(const Program *program, PyObject *fast, CUdeviceptr *addresses) {
  for (Py_ssize_t i = 0; i < program->n_tensors; ++i) {
    PyObject *tensor = PySequence_Fast_GET_ITEM(fast, i);
    const Layout *layout = &program->layouts[i];
    PyObject *dtype = PyObject_GetAttr(tensor, dtype_name);
    if (!dtype)
      return -1;
    int same_dtype = dtype == layout->dtype;
    Py_DECREF(dtype);
    if (!same_dtype)
      return 0;
    PyObject *shape = PyObject_GetAttr(tensor, shape_name);
    int same = shape ? same_ints(shape, layout->sizes, layout->ndim) : -1;
    Py_XDECREF(shape);
    if (same != 1)
      return same;
    PyObject *strides = PyObject_CallMethodNoArgs(tensor, stride_name);
    same = strides ? same_ints(strides, layout->strides, layout->ndim) : -1;
    Py_XDECREF(strides);
    if (same != 1)
      return same;
    PyObject *address = PyObject_CallMethodNoArgs(tensor, data_ptr_name);
    if (!address)
      return -1;
    addresses[i] = PyLong_AsUnsignedLongLong(address);
    Py_DECREF(address);
    if (PyErr_Occurred())
      return -1;
    if (addresses[i] % 16 != layout->alignment)
      return 0;
  }
  return 1;
}

static Program *program_of(PyObject *capsule) {
  return PyCapsule_GetPointer(capsule, "triton_fused.Program");
}

static Operation *append(Program *program) {
  if (program->n_ops == program->capacity) {
    Py_ssize_t capacity = program->capacity ? 2 * program->capacity : 16;
    Operation *ops = realloc(program->ops, capacity * sizeof(Operation));
    if (!ops) {
      PyErr_NoMemory();
      return NULL;
    }
    program->ops = ops;
    program->capacity = capacity;
  }
  Operation *op = &program->ops[program->n_ops++];
  memset(op, 0, sizeof(*op));
  return op;
}

/* new(layouts): an empty program, on the current CUDA context, for calls of one tensor per (dtype, shape, strides,
   address modulo 16) in `layouts`. */
static PyObject *new_program(PyObject *self, PyObject *args) {
  PyObject *layouts;
  if (!PyArg_ParseTuple(args, "O", &layouts))
    return NULL;
  PyObject *fast = PySequence_Fast(layouts, "layouts must be a sequence of (dtype, shape, strides, alignment)");
  if (!fast)
    return NULL;
  Program *program = calloc(1, sizeof(Program));
  PyObject *capsule = NULL;
  if (!program) {
    Py_DECREF(fast);
    return PyErr_NoMemory();
  }
  program->n_tensors = PySequence_Fast_GET_SIZE(fast);
  program->layouts = calloc(program->n_tensors ? program->n_tensors : 1, sizeof(Layout));
  if (!program->layouts) {
    PyErr_NoMemory();
    goto fail;
  }
  for (Py_ssize_t i = 0; i < program->n_tensors; ++i) {
    Layout *layout = &program->layouts[i];
    PyObject *dtype, *shape, *strides;
    Py_ssize_t n_strides;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "OOOK", &dtype, &shape, &strides, &layout->alignment) ||
        !read_ints(shape, layout->sizes, &layout->ndim) || !read_ints(strides, layout->strides, &n_strides))
      goto fail;
    if (n_strides != layout->ndim) {
      PyErr_Format(PyExc_ValueError, "tensor %zd has %zd sizes and %zd strides", i, layout->ndim, n_strides);
      goto fail;
    }
    Py_INCREF(dtype);
    layout->dtype = dtype;
  }
  if (!check(cuCtxGetCurrent(&program->context), "cuCtxGetCurrent") || !program->context) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_RuntimeError, "no current CUDA context");
    goto fail;
  }
  capsule = PyCapsule_New(program, "triton_fused.Program", free_program);
  if (capsule) {
    Py_DECREF(fast);
    return capsule;
  }
fail:
  Py_DECREF(fast);
  destroy(program);
  return NULL;
}

/* Patches from a sequence of (parameter, tensor) pairs, checked against the parameters and the call's tensors. */
static Patch *patches_of(PyObject *pairs, Py_ssize_t n_params, Py_ssize_t n_tensors, Py_ssize_t *count) {
  PyObject *fast = PySequence_Fast(pairs, "patches must be a sequence of (parameter, tensor) pairs");
  if (!fast)
    return NULL;
  *count = PySequence_Fast_GET_SIZE(fast);
  Patch *patches = calloc(*count ? *count : 1, sizeof(Patch));
  if (!patches) {
    Py_DECREF(fast);
    PyErr_NoMemory();
    return NULL;
  }
  for (Py_ssize_t i = 0; i < *count; ++i) {
    int param, tensor;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "ii", &param, &tensor))
      goto fail;
    if (param < 0 || param >= n_params || tensor < 0 || tensor >= n_tensors) {
      PyErr_Format(PyExc_ValueError, "patch (%d, %d) is out of range", param, tensor);
      goto fail;
    }
    patches[i] = (Patch){param, tensor};
  }
  Py_DECREF(fast);
  return patches;
fail:
  Py_DECREF(fast);
  free(patches);
  return NULL;
}

/* Copies one parameter's value into storage: an int (its low `size` bytes: pointers, integers, floats' bits) or, of
   128 bytes, a Triton CUtensorMap object. */
static int store(char *slot, Py_ssize_t size, PyObject *value) {
  if (size == 128) {
    PyTypeObject *type = Py_TYPE(value);
    if (strcmp(type->tp_name, "triton.backends.nvidia.PyCUtensorMap") != 0 ||
        type->tp_basicsize != (Py_ssize_t)sizeof(TritonTensorMap)) {
      PyErr_Format(PyExc_TypeError, "a 128-byte parameter must be Triton's CUtensorMap, not %s", type->tp_name);
      return 0;
    }
    memcpy(slot, &((TritonTensorMap *)value)->tensorMap, 128);
    return 1;
  }
  if (!PyLong_Check(value) || size < 1 || size > 8) {
    PyErr_Format(PyExc_TypeError, "a parameter of %zd bytes must be an int", size);
    return 0;
  }
  unsigned long long bits = PyLong_AsUnsignedLongLongMask(value);
  if (bits == (unsigned long long)-1 && PyErr_Occurred())
    return 0;
  memcpy(slot, &bits, size); /* little-endian: the low bytes first */
  return 1;
}

/* launch(program, function, grid, num_warps, num_ctas, shared_memory, stream, pdl, cooperative, params, pointers,
   maps): appends a launch. params: (size, value) per kernel parameter, in order, which must match the kernel's own
   parameter sizes (cuFuncGetParamInfo); pointers and maps: (parameter, tensor) pairs. */
static PyObject *add_launch(PyObject *self, PyObject *args) {
  PyObject *capsule, *params, *pointers, *maps;
  unsigned long long function, stream;
  unsigned int grid_x, grid_y, grid_z;
  int num_warps, num_ctas, shared_memory, pdl, cooperative;
  if (!PyArg_ParseTuple(args, "OK(III)iiiKppOOO", &capsule, &function, &grid_x, &grid_y, &grid_z, &num_warps,
                        &num_ctas, &shared_memory, &stream, &pdl, &cooperative, &params, &pointers, &maps))
    return NULL;
  Program *program = program_of(capsule);
  if (!program)
    return NULL;
  PyObject *fast = PySequence_Fast(params, "params must be a sequence of (size, value) pairs");
  if (!fast)
    return NULL;
  Py_ssize_t n_params = PySequence_Fast_GET_SIZE(fast);
  CUfunction kernel = (CUfunction)(uintptr_t)function;
  Operation op;
  memset(&op, 0, sizeof(op));
  op.kind = LAUNCH;
  op.function = kernel;
  op.storage = aligned_alloc(128, 128 * (n_params ? n_params : 1));
  op.params = calloc(n_params ? n_params : 1, sizeof(void *));
  if (!op.storage || !op.params) {
    PyErr_NoMemory();
    goto fail;
  }
  memset(op.storage, 0, 128 * (n_params ? n_params : 1));
  for (Py_ssize_t i = 0; i < n_params; ++i) {
    Py_ssize_t size;
    PyObject *value;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "nO", &size, &value))
      goto fail;
    size_t offset, expected;
    if (!check(cuFuncGetParamInfo(kernel, i, &offset, &expected), "cuFuncGetParamInfo"))
      goto fail;
    if ((size_t)size != expected) {
      PyErr_Format(PyExc_ValueError, "parameter %zd has %zu bytes in the kernel, not %zd", i, expected, size);
      goto fail;
    }
    op.params[i] = op.storage + 128 * i;
    if (!store(op.params[i], size, value))
      goto fail;
  }
  size_t offset, size;
  if (cuFuncGetParamInfo(kernel, n_params, &offset, &size) == CUDA_SUCCESS) {
    PyErr_Format(PyExc_ValueError, "the kernel has more than the %zd parameters given", n_params);
    goto fail;
  }
  if (!(op.pointers = patches_of(pointers, n_params, program->n_tensors, &op.n_pointers)) ||
      !(op.maps = patches_of(maps, n_params, program->n_tensors, &op.n_maps)))
    goto fail;

  op.empty = (unsigned long long)grid_x * grid_y * grid_z == 0;
  CUlaunchConfig *config = &op.config;
  config->gridDimX = grid_x * num_ctas;
  config->gridDimY = grid_y;
  config->gridDimZ = grid_z;
  config->blockDimX = 32 * num_warps;
  config->blockDimY = config->blockDimZ = 1;
  config->sharedMemBytes = shared_memory;
  config->hStream = (CUstream)(uintptr_t)stream;
  unsigned int n = 0;
  if (pdl) {
    op.attributes[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    op.attributes[n++].value.programmaticStreamSerializationAllowed = 1;
  }
  if (cooperative) {
    op.attributes[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    op.attributes[n++].value.cooperative = 1;
  }
  if (num_ctas != 1) {
    op.attributes[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    op.attributes[n].value.clusterDim.x = num_ctas;
    op.attributes[n].value.clusterDim.y = op.attributes[n].value.clusterDim.z = 1;
    ++n;
    op.attributes[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    op.attributes[n++].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
  }
  config->numAttrs = n;
  Py_DECREF(fast);
  Operation *slot = append(program);
  if (!slot) {
    free_operation(&op);
    return NULL;
  }
  *slot = op;
  Py_RETURN_NONE;
fail:
  Py_DECREF(fast);
  free_operation(&op);
  return NULL;
}

/* record(program, event, stream) and wait(program, stream, event): append an event record or a stream wait. */
static PyObject *add_event(PyObject *args, int kind) {
  PyObject *capsule;
  unsigned long long first, second;
  if (!PyArg_ParseTuple(args, "OKK", &capsule, &first, &second))
    return NULL;
  Program *program = program_of(capsule);
  Operation *op = program ? append(program) : NULL;
  if (!op)
    return NULL;
  op->kind = kind;
  op->event = (CUevent)(uintptr_t)(kind == RECORD ? first : second);
  op->stream = (CUstream)(uintptr_t)(kind == RECORD ? second : first);
  Py_RETURN_NONE;
}

static PyObject *add_record(PyObject *self, PyObject *args) { return add_event(args, RECORD); }

static PyObject *add_wait(PyObject *self, PyObject *args) { return add_event(args, WAIT); }

/* replay(program, tensors): every operation, with the tensors' addresses put in; True, or False (nothing issued) where
   the tensors are not as many as the recorded call's or one's dtype, shape, strides or alignment differs. */
static PyObject *replay(PyObject *self, PyObject *args) {
  PyObject *capsule, *tensors;
  if (!PyArg_ParseTuple(args, "OO", &capsule, &tensors))
    return NULL;
  Program *program = program_of(capsule);
  if (!program)
    return NULL;
  PyObject *fast = PySequence_Fast(tensors, "tensors must be a sequence");
  if (!fast)
    return NULL;
  if (PySequence_Fast_GET_SIZE(fast) != program->n_tensors) {
    Py_DECREF(fast);
    return Py_NewRef(Py_False);
  }
  CUdeviceptr stack[32];
  CUdeviceptr *addresses = program->n_tensors <= 32 ? stack : malloc(program->n_tensors * sizeof(CUdeviceptr));
  if (!addresses) {
    Py_DECREF(fast);
    return PyErr_NoMemory();
  }
  int matched = read_call(program, fast, addresses);
  Py_DECREF(fast);
  CUresult result = CUDA_SUCCESS;
  const char *what = "";
  Py_ssize_t failed = -1; /* the operation under way */
  /* The GIL stays held: two threads replaying one program would write the same parameters. */
  if (matched == 1) {
    CUcontext current;
    result = cuCtxGetCurrent(&current);
    what = "cuCtxGetCurrent";
    if (result == CUDA_SUCCESS && current != program->context) {
      result = cuCtxSetCurrent(program->context);
      what = "cuCtxSetCurrent";
    }
    for (Py_ssize_t i = 0; result == CUDA_SUCCESS && i < program->n_ops; ++i) {
      Operation *op = &program->ops[i];
      failed = i;
      if (op->kind == RECORD) {
        result = cuEventRecord(op->event, op->stream);
        what = "cuEventRecord";
      } else if (op->kind == WAIT) {
        result = cuStreamWaitEvent(op->stream, op->event, 0);
        what = "cuStreamWaitEvent";
      } else if (!op->empty) {
        for (Py_ssize_t j = 0; j < op->n_pointers; ++j)
          memcpy(op->params[op->pointers[j].param], &addresses[op->pointers[j].tensor], sizeof(CUdeviceptr));
        for (Py_ssize_t j = 0; result == CUDA_SUCCESS && j < op->n_maps; ++j) {
          result = cuTensorMapReplaceAddress((CUtensorMap *)op->params[op->maps[j].param],
                                             (void *)(uintptr_t)addresses[op->maps[j].tensor]);
          what = "cuTensorMapReplaceAddress";
        }
        if (result == CUDA_SUCCESS) {
          op->config.attrs = op->attributes; /* set here: the operations move as the program grows */
          result = cuLaunchKernelEx(&op->config, op->function, op->params, NULL);
          what = "cuLaunchKernelEx";
        }
      }
    }
  }
  if (addresses != stack)
    free(addresses);
  if (matched != 1)
    return matched == 0 ? Py_NewRef(Py_False) : NULL;
  if (result != CUDA_SUCCESS && failed < 0)
    return check(result, what), NULL;
  if (result != CUDA_SUCCESS) {
    const char *message = NULL;
    cuGetErrorString(result, &message);
    Operation *op = &program->ops[failed];
    PyErr_Format(PyExc_RuntimeError, "operation %zd of the replay: %s failed: %s (grid %u x %u x %u, block %u, "
                 "%u bytes of shared memory, %u launch attributes)", failed, what, message ? message : "unknown error",
                 op->config.gridDimX, op->config.gridDimY, op->config.gridDimZ, op->config.blockDimX,
                 op->config.sharedMemBytes, op->config.numAttrs);
    return NULL;
  }
  Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"new", new_program, METH_VARARGS, "new(layouts): an empty program on the current CUDA context"},
    {"launch", add_launch, METH_VARARGS, "append a kernel launch"},
    {"record", add_record, METH_VARARGS, "record(program, event, stream): append an event record"},
    {"wait", add_wait, METH_VARARGS, "wait(program, stream, event): append a stream wait"},
    {"replay", replay, METH_VARARGS, "replay(program, tensors): issue every operation with the call's tensors, "
                                     "if they have the recorded layouts"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "triton_fused_replay", NULL, -1, methods};

PyMODINIT_FUNC PyInit_triton_fused_replay(void) {
  data_ptr_name = PyUnicode_InternFromString("data_ptr");
  dtype_name = PyUnicode_InternFromString("dtype");
  shape_name = PyUnicode_InternFromString("shape");
  stride_name = PyUnicode_InternFromString("stride");
  if (!data_ptr_name || !dtype_name || !shape_name || !stride_name)
    return NULL;
  return PyModule_Create(&module);
}
