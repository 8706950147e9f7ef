// Kernels for Relax ops whose results have data-dependent shapes (NonZero, Unique, and
// NonMaxSuppression over a run-time box count), the time loop of recurrent
// layers (edgec_recurrent), the stacked outputs of Loop and Scan (edgec_rows_*) and their
// iterations (edgec_loop).
//
// TVM 0.27 lowers `relax.nonzero` and `relax.unique` to calls of "relax.run.nonzero" and
// "relax.run.unique", functions registered by TVM's *Python* package: a runtime-only install or a
// C/C++ host does not have them. edgec renames those calls to the functions below
// (edgec/compiler/transform/native_kernels.py) and links this file into every model library that needs
// them, so the artifact runs wherever libtvm_runtime does. Semantics follow numpy, as TVM's
// Python versions do.

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <numeric>
#include <omp.h>
#include <vector>

namespace {

namespace ffi = tvm::ffi;

// Bytes of one element of `t` (all its lanes).
size_t ItemBytes(const DLTensor* t) { return (t->dtype.bits * t->dtype.lanes + 7) / 8; }

// Host allocations aligned like TVM's own, so compiled kernels may use aligned loads on them.
struct AlignedCPUAlloc {
  void AllocData(DLTensor* tensor) {
    size_t bytes = ItemBytes(tensor);
    for (int i = 0; i < tensor->ndim; ++i) bytes *= static_cast<size_t>(tensor->shape[i]);
    tensor->data = std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
    if (tensor->data == nullptr) TVM_FFI_THROW(RuntimeError) << "edgec: out of memory";
  }
  void FreeData(DLTensor* tensor) { std::free(tensor->data); }
};

ffi::Tensor Empty(std::vector<int64_t> shape, DLDataType dtype) {
  return ffi::Tensor::FromNDAlloc(AlignedCPUAlloc(), ffi::Shape(shape), dtype, DLDevice{kDLCPU, 0});
}

int64_t NumElements(const DLTensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

void CheckCPUContiguous(const ffi::Tensor& x, const char* op) {
  const DLTensor* t = x.GetDLTensorPtr();
  if (t->device.device_type != kDLCPU) TVM_FFI_THROW(ValueError) << op << ": input is not on the CPU";
  if (t->strides != nullptr) {
    int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
      if (t->shape[i] != 1 && t->strides[i] != expected) {
        TVM_FFI_THROW(ValueError) << op << ": input is not contiguous";
      }
      expected *= t->shape[i];
    }
  }
}

// Element i of x as a double and as raw bytes (for exact equality of any dtype).
const uint8_t* ElementBytes(const DLTensor* t, int64_t i) {
  return static_cast<const uint8_t*>(t->data) + t->byte_offset + i * ItemBytes(t);
}

bool IsNonZero(const DLTensor* t, int64_t i) {
  const uint8_t* p = ElementBytes(t, i);
  switch (t->dtype.code) {
    case kDLFloat:
      if (t->dtype.bits == 32) return *reinterpret_cast<const float*>(p) != 0.0f;
      if (t->dtype.bits == 64) return *reinterpret_cast<const double*>(p) != 0.0;
      if (t->dtype.bits == 16) return (*reinterpret_cast<const uint16_t*>(p) & 0x7fff) != 0;
      break;
    case kDLBfloat:
      return (*reinterpret_cast<const uint16_t*>(p) & 0x7fff) != 0;
    default: {
      size_t size = (t->dtype.bits + 7) / 8;
      for (size_t b = 0; b < size; ++b) {
        if (p[b] != 0) return true;
      }
      return false;
    }
  }
  TVM_FFI_THROW(TypeError) << "edgec_nonzero: unsupported float width " << t->dtype.bits;
}

double AsDouble(const DLTensor* t, int64_t i) {
  const uint8_t* p = ElementBytes(t, i);
  switch (t->dtype.code) {
    case kDLFloat:
      if (t->dtype.bits == 32) return *reinterpret_cast<const float*>(p);
      if (t->dtype.bits == 64) return *reinterpret_cast<const double*>(p);
      break;
    case kDLBfloat: {  // the upper half of a float32
      uint32_t bits = static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(p)) << 16;
      float value;
      std::memcpy(&value, &bits, sizeof(value));
      return value;
    }
    case kDLInt:
      if (t->dtype.bits == 64) return static_cast<double>(*reinterpret_cast<const int64_t*>(p));
      if (t->dtype.bits == 32) return *reinterpret_cast<const int32_t*>(p);
      if (t->dtype.bits == 16) return *reinterpret_cast<const int16_t*>(p);
      if (t->dtype.bits == 8) return *reinterpret_cast<const int8_t*>(p);
      break;
    case kDLUInt:
    case kDLBool:
      if (t->dtype.bits == 64) return static_cast<double>(*reinterpret_cast<const uint64_t*>(p));
      if (t->dtype.bits == 32) return *reinterpret_cast<const uint32_t*>(p);
      if (t->dtype.bits == 16) return *reinterpret_cast<const uint16_t*>(p);
      if (t->dtype.bits <= 8) return *p;
      break;
  }
  TVM_FFI_THROW(TypeError) << "edgec_unique: unsupported dtype code " << int(t->dtype.code)
                           << " bits " << int(t->dtype.bits);
}

// numpy.nonzero(np.atleast_1d(x)) stacked: int64 [ndim, count], row-major order of elements.
ffi::Tensor NonZero(ffi::Tensor x) {
  CheckCPUContiguous(x, "edgec_nonzero");
  const DLTensor* t = x.GetDLTensorPtr();
  int ndim = std::max(t->ndim, 1);
  int64_t n = NumElements(t);
  std::vector<int64_t> hits;
  for (int64_t i = 0; i < n; ++i) {
    if (IsNonZero(t, i)) hits.push_back(i);
  }
  int64_t count = static_cast<int64_t>(hits.size());
  ffi::Tensor out = Empty({ndim, count}, DLDataType{kDLInt, 64, 1});
  int64_t* data = static_cast<int64_t*>(out.data_ptr());
  for (int64_t k = 0; k < count; ++k) {
    int64_t flat = hits[k];
    for (int axis = ndim - 1; axis >= 0; --axis) {
      int64_t extent = t->ndim == 0 ? 1 : t->shape[axis];
      data[axis * count + k] = flat % extent;
      flat /= extent;
    }
  }
  return out;
}

// Items 0..n-1 grouped into equal ones, in the order `less` sorts them (stable): each group's
// first item and size, each item's group, and each group's output position (sorted order, or
// order of first occurrence when `sorted` is false, TVM's "sorted=0").
struct Groups {
  std::vector<int64_t> first, counts, group_of, rank;
};

template <typename Less>
Groups GroupItems(int64_t n, bool sorted, Less less) {
  Groups g;
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), less);
  g.group_of.resize(n);
  for (int64_t k = 0; k < n; ++k) {
    int64_t i = order[k];
    if (k == 0 || less(order[k - 1], i)) {
      g.first.push_back(i);
      g.counts.push_back(0);
    }
    g.counts.back() += 1;
    g.group_of[i] = static_cast<int64_t>(g.first.size()) - 1;
  }
  int64_t groups = static_cast<int64_t>(g.first.size());
  g.rank.resize(groups);
  std::iota(g.rank.begin(), g.rank.end(), 0);
  if (!sorted) {
    std::vector<int64_t> by_first(groups);
    std::iota(by_first.begin(), by_first.end(), 0);
    std::sort(by_first.begin(), by_first.end(),
              [&](int64_t a, int64_t b) { return g.first[a] < g.first[b]; });
    for (int64_t pos = 0; pos < groups; ++pos) g.rank[by_first[pos]] = pos;
  }
  return g;
}

// The unique outputs the flags ask for, in numpy's order: values, index, inverse, counts.
// `values` is filled by the caller; the others are int64 [groups] or [n].
ffi::Array<ffi::Tensor> UniqueOutputs(const Groups& g, ffi::Tensor values, int64_t n,
                                      bool want_index, bool want_inverse, bool want_counts) {
  int64_t groups = static_cast<int64_t>(g.first.size());
  ffi::Tensor index = Empty({groups}, DLDataType{kDLInt, 64, 1});
  ffi::Tensor count = Empty({groups}, DLDataType{kDLInt, 64, 1});
  for (int64_t k = 0; k < groups; ++k) {
    static_cast<int64_t*>(index.data_ptr())[g.rank[k]] = g.first[k];
    static_cast<int64_t*>(count.data_ptr())[g.rank[k]] = g.counts[k];
  }
  ffi::Tensor inverse = Empty({n}, DLDataType{kDLInt, 64, 1});
  for (int64_t i = 0; i < n; ++i) static_cast<int64_t*>(inverse.data_ptr())[i] = g.rank[g.group_of[i]];
  ffi::Array<ffi::Tensor> outputs{values};
  if (want_index) outputs.push_back(index);
  if (want_inverse) outputs.push_back(inverse);
  if (want_counts) outputs.push_back(count);
  return outputs;
}

ffi::Any OneOrAll(const ffi::Array<ffi::Tensor>& outputs) {
  if (outputs.size() == 1) return outputs[0];
  return outputs;
}

// numpy.unique over the flattened input (axis=None). Values keep the input's dtype.
ffi::Any Unique(ffi::Tensor x, bool sorted, bool return_index, bool return_inverse,
                bool return_counts) {
  CheckCPUContiguous(x, "edgec_unique");
  const DLTensor* t = x.GetDLTensorPtr();
  int64_t n = NumElements(t);
  size_t size = ItemBytes(t);
  Groups g = GroupItems(n, sorted, [&](int64_t a, int64_t b) { return AsDouble(t, a) < AsDouble(t, b); });
  int64_t groups = static_cast<int64_t>(g.first.size());
  ffi::Tensor values = Empty({groups}, t->dtype);
  for (int64_t k = 0; k < groups; ++k) {
    std::memcpy(static_cast<uint8_t*>(values.data_ptr()) + g.rank[k] * size, ElementBytes(t, g.first[k]), size);
  }
  return OneOrAll(UniqueOutputs(g, values, n, return_index, return_inverse, return_counts));
}

// numpy.unique(x, axis=axis): the slices along `axis`, compared lexicographically (the other
// dims row-major), as ONNX Unique with an axis. Values: x's shape with `axis` the group count.
ffi::Any UniqueAxis(ffi::Tensor x, bool sorted, bool return_index, bool return_inverse,
                    bool return_counts, int64_t axis) {
  CheckCPUContiguous(x, "edgec_unique_axis");
  const DLTensor* t = x.GetDLTensorPtr();
  if (axis < 0) axis += t->ndim;
  if (axis < 0 || axis >= t->ndim) TVM_FFI_THROW(ValueError) << "edgec_unique_axis: axis out of range";
  int64_t n = t->shape[axis], outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= t->shape[i];
  for (int i = axis + 1; i < t->ndim; ++i) inner *= t->shape[i];
  size_t size = ItemBytes(t);
  auto at = [&](int64_t slice, int64_t o, int64_t j) { return (o * n + slice) * inner + j; };
  Groups g = GroupItems(n, sorted, [&](int64_t a, int64_t b) {
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t j = 0; j < inner; ++j) {
        double va = AsDouble(t, at(a, o, j)), vb = AsDouble(t, at(b, o, j));
        if (va != vb) return va < vb;
      }
    }
    return false;
  });
  int64_t groups = static_cast<int64_t>(g.first.size());
  std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
  shape[axis] = groups;
  ffi::Tensor values = Empty(shape, t->dtype);
  uint8_t* out = static_cast<uint8_t*>(values.data_ptr());
  for (int64_t k = 0; k < groups; ++k) {
    for (int64_t o = 0; o < outer; ++o) {
      std::memcpy(out + ((o * groups + g.rank[k]) * inner) * size,
                  ElementBytes(t, at(g.first[k], o, 0)), inner * size);
    }
  }
  return OneOrAll(UniqueOutputs(g, values, n, return_index, return_inverse, return_counts));
}


// One direction of an ONNX LSTM, GRU or RNN layer over all its time steps (edgec/compiler/
// recurrent.py emits it for float32 layers with the default activations). The input projection
// x·Wᵀ + biases comes in computed (one library matmul before the loop); each step adds h·Rᵀ,
// applies the gates and writes the new state. Running the loop here instead of as a Relax
// loop saves the VM's calls and allocations of every step (measured: 3-7x onnxruntime's time
// as a loop).
//
// x [steps, batch, gates*hidden]; r_t = Rᵀ [hidden, gates*hidden]; h0, c0 [batch, hidden];
// peep [3*hidden] (i, o, f); lens [batch] int32; rbh [hidden] (GRU with linear_before_reset);
// config int64 [kind (0 LSTM, 1 GRU, 2 RNN), reverse, input_forget, linear_before_reset, has
// peep, has lens, RNN activation (0 tanh, 1 relu, 2 sigmoid), has clip]; clip float32 [1].
// Outputs y [steps, batch, hidden] (zeros past a row's length), h_out, c_out [batch, hidden].
// The library is built with -O2 for any CPU of its architecture: the one hot loop asks for full
// vectorization, and on x86-64 also gets an AVX2+FMA copy chosen at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define EDGEC_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default"), optimize("O3")))
#elif defined(__GNUC__) && !defined(__clang__)
#define EDGEC_VECTOR_CLONES __attribute__((optimize("O3")))
#else
#define EDGEC_VECTOR_CLONES
#endif

// acc[0:n] += h · m, m's k rows ``stride`` apart: the recurrent matmul of one batch row. Blocks
// of acc stay in registers while every row adds into them (one pass over acc per row was bound
// by its loads and stores).
constexpr int64_t kBlock = 64;

EDGEC_VECTOR_CLONES
void AddMatVec(float* acc, const float* h, const float* m, int64_t k, int64_t n, int64_t stride) {
  int64_t i0 = 0;
  for (; i0 + kBlock <= n; i0 += kBlock) {
    float block[kBlock];
    for (int64_t i = 0; i < kBlock; ++i) block[i] = acc[i0 + i];
    for (int64_t j = 0; j < k; ++j) {
      const float a = h[j];
      const float* row = m + j * stride + i0;
      for (int64_t i = 0; i < kBlock; ++i) block[i] += a * row[i];
    }
    for (int64_t i = 0; i < kBlock; ++i) acc[i0 + i] = block[i];
  }
  for (int64_t j = 0; j < k && i0 < n; ++j) {
    const float a = h[j];
    const float* row = m + j * stride;
    for (int64_t i = i0; i < n; ++i) acc[i] += a * row[i];
  }
}

// exp for the gates, written so that loops over it vectorize (libm's expf is a call per
// element: 512 of them per LSTM step of hidden 128 were most of its time). Cephes' polynomial
// after reducing by ln 2: about 2 ulp; inputs clamped where float32 exp over/underflows.
inline float GateExp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

inline float Sigmoid(float v) { return 1.0f / (1.0f + GateExp(-v)); }

// tanh through exp of -2|v|, which cannot overflow.
inline float Tanh(float v) {
  const float e = GateExp(-2.0f * std::fabs(v));
  const float t = (1.0f - e) / (1.0f + e);
  return v < 0.0f ? -t : t;
}

enum Activation { kSigmoid, kTanh, kRelu };

// v[0:n] = f(clip(v[0:n])) in one vectorizable loop.
EDGEC_VECTOR_CLONES
void Activate(float* v, int64_t n, Activation f, bool has_clip, float limit) {
  if (has_clip) {
    for (int64_t i = 0; i < n; ++i) v[i] = std::min(std::max(v[i], -limit), limit);
  }
  if (f == kSigmoid) {
    for (int64_t i = 0; i < n; ++i) v[i] = Sigmoid(v[i]);
  } else if (f == kTanh) {
    for (int64_t i = 0; i < n; ++i) v[i] = Tanh(v[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) v[i] = std::max(v[i], 0.0f);
  }
}

// A tensor's first element: TVM's planned buffers and constants start at a byte offset, which
// ffi::Tensor::data_ptr() leaves out.
template <typename T>
T* Elements(const ffi::Tensor& t) {
  const DLTensor* d = t.GetDLTensorPtr();
  return reinterpret_cast<T*>(static_cast<char*>(d->data) + d->byte_offset);
}

const float* FloatData(const ffi::Tensor& t, const char* what, int64_t at_least) {
  const DLTensor* d = t.GetDLTensorPtr();
  if (d->device.device_type != kDLCPU || d->dtype.code != kDLFloat || d->dtype.bits != 32) {
    TVM_FFI_THROW(ValueError) << "edgec_recurrent: " << what << " is not a float32 CPU tensor";
  }
  if (NumElements(d) < at_least) {
    TVM_FFI_THROW(ValueError) << "edgec_recurrent: " << what << " has " << NumElements(d)
                              << " elements, needs " << at_least;
  }
  return Elements<const float>(t);
}

// One recurrent layer's run, shared by the tasks that split its hidden units.
struct RecurrentJob {
  int kind, gates;
  bool reverse, input_forget, linear_before_reset, has_clip;
  Activation rnn_activation;
  int64_t steps, batch, width, hidden;
  float limit;
  const float *xs, *rt, *p, *rb;
  const int64_t* length;
  float *ys, *c, *reset_h;
  float* h[2];  // the state before and after a step, swapped each step
};

// A barrier wait this long (and four times the waiting task's own work that step) means a task
// was descheduled: every later step would wait for it again (speech_lstm ran 50-70x slower than
// onnxruntime beside two CPU-bound processes on two cores, 1.6x quiet). The tasks then agree to
// let task 0 run the remaining steps alone. When calls keep doing so (kStallsToHold in a row),
// the next calls run on one thread from the start: 1, then 2, 4... up to kMostSerialCalls while
// the stalls go on; a call that runs its threads without one starts the count again. The quiet
// cores of this virtual machine stall too (0.2-1 ms, about one call in ten): such a stall
// costs the rest of its own call on one thread, while cores that stay taken (a stall nearly
// every call) get their threads probed once in 64 calls.
constexpr int64_t kSlowBarrierNs = 200 * 1000;
constexpr int kStallsToHold = 3;
constexpr int kMostSerialCalls = 64;
std::atomic<int> serial_calls_left{0};
std::atomic<int> stalled_calls{0};  // threaded calls in a row that gave up their threads

int64_t MonotonicNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

// Whether this call of a recurrent loop may split its steps over threads (see above).
bool ThreadsWelcome() {
  int left = serial_calls_left.load(std::memory_order_relaxed);
  while (left > 0) {
    if (serial_calls_left.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) {
      return false;
    }
  }
  return true;
}

// After a call that ran its threads: whether a task was descheduled sets the next calls' threads.
void AfterThreadedCall(bool gave_up) {
  if (!gave_up) {
    stalled_calls.store(0, std::memory_order_relaxed);
    return;
  }
  const int stalls = stalled_calls.fetch_add(1, std::memory_order_relaxed) + 1;
  if (stalls >= kStallsToHold) {
    const int doublings = std::min(stalls - kStallsToHold, 6);
    serial_calls_left.store(std::min(1 << doublings, kMostSerialCalls), std::memory_order_relaxed);
  }
}

// Task ``task`` runs every step for its slice of hidden units (whole vectors of 16) of every
// batch row: their gate rows from the whole previous state, then their new state. The tasks
// meet at a barrier after each step (and in a GRU whose reset gate scales the state before R_h,
// once more within it), so a task reads only states every task has finished writing. Each
// element sums the same products in the same order however many tasks there are: the outputs
// do not depend on the threads, nor on a switch to one task midway. A task kept waiting long at
// a barrier writes, in its own cache line of ``stalls``, the step it is then in (its first such
// step only); at the start of each step every task reads the lines and counts only stalls
// written in earlier steps (before the barrier it has just passed), so all tasks see the same
// ones and decide alike. The lines
// are written only on a stall: the steps, of a few microseconds, share no cache line otherwise.
// Returns whether the tasks gave up their threads.
struct alignas(64) Stall {
  std::atomic<int64_t> step{-1};
};

bool RecurrentSlice(const RecurrentJob& job, int task, int tasks, Stall* stalls) {
  const int64_t hidden = job.hidden, width = job.width, batch = job.batch;
  int64_t j0 = 0, m = 0;
  std::vector<float> g, hr;
  auto take_slice = [&] {
    const int64_t slice = ((hidden + tasks - 1) / tasks + 15) / 16 * 16;
    j0 = std::min(hidden, task * slice);
    m = std::min(hidden, j0 + slice) - j0;
    g.resize(std::max<int64_t>(batch * job.gates * m, 1));
    hr.resize(std::max<int64_t>(batch * m, 1));
  };
  take_slice();
  int64_t step_start = 0;
  bool waited_long = false, gave_up = false;
  auto barrier = [&] {
    if (tasks > 1) {
      const int64_t arrived = MonotonicNs();
#pragma omp barrier
      const int64_t waited = MonotonicNs() - arrived;
      waited_long |= waited > kSlowBarrierNs && waited > 4 * (arrived - step_start);
    }
  };
  for (int64_t step = 0; step < job.steps; ++step) {
    if (tasks > 1) {
      // Step 0's wait includes waking the pool's threads, slow on a quiet machine too. The first
      // stall stays: a later one overwriting it could hide it from a task about to read it.
      std::atomic<int64_t>& mine = stalls[task].step;
      if (waited_long && step > 1 && mine.load(std::memory_order_relaxed) < 0) {
        mine.store(step, std::memory_order_relaxed);
      }
      if (std::any_of(stalls, stalls + tasks, [step](const Stall& stall) {
            const int64_t at = stall.step.load(std::memory_order_relaxed);
            return at >= 0 && at < step;
          })) {
        if (task != 0) return true;
        tasks = 1;
        gave_up = true;
        take_slice();
      }
    }
    step_start = MonotonicNs();
    waited_long = false;
    const int64_t t = job.reverse ? job.steps - 1 - step : step;
    const float* h_prev_all = job.h[step % 2];
    float* h_next_all = job.h[(step + 1) % 2];
    // This slice's gate rows: x + h·R over its columns (a GRU's candidate waits for r ⊙ h).
    for (int64_t n = 0; n < batch; ++n) {
      if (t >= job.length[n]) continue;
      const float* h_prev = h_prev_all + n * hidden;
      const float* x_row = job.xs + (t * batch + n) * width;
      float* gn = g.data() + n * job.gates * m;
      const int computed = job.kind == 1 ? 2 : job.gates;
      for (int q = 0; q < job.gates; ++q) {
        std::memcpy(gn + q * m, x_row + q * hidden + j0, sizeof(float) * m);
        if (q < computed) AddMatVec(gn + q * m, h_prev, job.rt + q * hidden + j0, hidden, m, width);
      }
      if (job.kind != 1) continue;
      Activate(gn, 2 * m, kSigmoid, job.has_clip, job.limit);  // z and r
      const float* gr = gn + m;
      if (job.linear_before_reset) {
        float* hn = hr.data() + n * m;
        std::fill(hn, hn + m, 0.0f);
        AddMatVec(hn, h_prev, job.rt + 2 * hidden + j0, hidden, m, width);
      } else {
        for (int64_t j = 0; j < m; ++j) job.reset_h[n * hidden + j0 + j] = gr[j] * h_prev[j0 + j];
      }
    }
    if (job.kind == 1 && !job.linear_before_reset) barrier();  // r ⊙ h whole in every row
    for (int64_t n = 0; n < batch; ++n) {
      const float* h_prev = h_prev_all + n * hidden + j0;
      float* h_next = h_next_all + n * hidden + j0;
      if (t >= job.length[n]) {  // past this row's sequence: state kept, output zero
        std::memcpy(h_next, h_prev, sizeof(float) * m);
        continue;
      }
      float* gn = g.data() + n * job.gates * m;
      float* out = job.ys + (t * batch + n) * hidden + j0;
      if (job.kind == 2) {  // RNN
        Activate(gn, m, job.rnn_activation, job.has_clip, job.limit);
        std::memcpy(h_next, gn, sizeof(float) * m);
        std::memcpy(out, gn, sizeof(float) * m);
      } else if (job.kind == 1) {  // GRU: h = n + z (h - n), n = tanh(x + the r-scaled h·R_h)
        const float *gz = gn, *gr = gn + m;
        float* x_h = gn + 2 * m;
        if (job.linear_before_reset) {
          const float* hn = hr.data() + n * m;
          for (int64_t j = 0; j < m; ++j) x_h[j] += gr[j] * (hn[j] + job.rb[j0 + j]);
        } else {
          AddMatVec(x_h, job.reset_h + n * hidden, job.rt + 2 * hidden + j0, hidden, m, width);
        }
        Activate(x_h, m, kTanh, job.has_clip, job.limit);
        for (int64_t j = 0; j < m; ++j) {
          const float value = x_h[j] + gz[j] * (h_prev[j] - x_h[j]);
          h_next[j] = value;
          out[j] = value;
        }
      } else {  // LSTM: gates i, o, f, c
        float *gi = gn, *go = gn + m, *gf = gn + 2 * m, *gc = gn + 3 * m;
        float* cn = job.c + n * hidden + j0;
        if (job.p) {
          for (int64_t j = 0; j < m; ++j) {
            gi[j] += job.p[j0 + j] * cn[j];
            gf[j] += job.p[2 * hidden + j0 + j] * cn[j];
          }
        }
        Activate(gi, m, kSigmoid, job.has_clip, job.limit);
        if (job.input_forget) {
          for (int64_t j = 0; j < m; ++j) gf[j] = 1.0f - gi[j];
        } else {
          Activate(gf, m, kSigmoid, job.has_clip, job.limit);
        }
        Activate(gc, m, kTanh, job.has_clip, job.limit);
        for (int64_t j = 0; j < m; ++j) cn[j] = gf[j] * cn[j] + gi[j] * gc[j];
        if (job.p) {
          for (int64_t j = 0; j < m; ++j) go[j] += job.p[hidden + j0 + j] * cn[j];
        }
        Activate(go, m, kSigmoid, job.has_clip, job.limit);
        std::memcpy(out, cn, sizeof(float) * m);
        Activate(out, m, kTanh, false, 0.0f);
        for (int64_t j = 0; j < m; ++j) {
          out[j] *= go[j];
          h_next[j] = out[j];
        }
      }
    }
    barrier();  // the new state whole before the next step reads it
  }
  return gave_up;
}

// Below this many multiply-adds per step one thread runs the loop: the barrier each step costs
// more than the share of work it hands over. An LSTM step of 20 steps, batch 1, 2 threads
// against 1 (Zen 3, 2 cores): hidden 64 (16,384) 1.6x slower, 96 (36,864) even, 128 (65,536)
// and 192 10% faster.
constexpr int64_t kParallelStepWork = 65536;

void Recurrent(ffi::Tensor x, ffi::Tensor r_t, ffi::Tensor h0, ffi::Tensor c0, ffi::Tensor peep,
               ffi::Tensor lens, ffi::Tensor rbh, ffi::Tensor config, ffi::Tensor clip,
               ffi::Tensor y, ffi::Tensor h_out, ffi::Tensor c_out) {
  for (const ffi::Tensor* t : {&x, &r_t, &h0, &c0, &y, &h_out, &c_out}) {
    CheckCPUContiguous(*t, "edgec_recurrent");
  }
  const DLTensor* xd = x.GetDLTensorPtr();
  if (xd->ndim != 3) TVM_FFI_THROW(ValueError) << "edgec_recurrent: x must be [steps, batch, gates*hidden]";
  // The config's integers (edgec may narrow int64 constants to int32 on the way).
  const DLTensor* cd = config.GetDLTensorPtr();
  if (cd->dtype.code != kDLInt || NumElements(cd) < 8) {
    TVM_FFI_THROW(ValueError) << "edgec_recurrent: config must hold 8 integers";
  }
  int64_t cfg[8];
  for (int k = 0; k < 8; ++k) {
    cfg[k] = cd->dtype.bits == 64 ? Elements<const int64_t>(config)[k] : Elements<const int32_t>(config)[k];
  }
  RecurrentJob job;
  job.kind = static_cast<int>(cfg[0]);
  job.gates = job.kind == 0 ? 4 : job.kind == 1 ? 3 : 1;
  job.reverse = cfg[1];
  job.input_forget = cfg[2];
  job.linear_before_reset = cfg[3];
  const bool has_peep = cfg[4], has_lens = cfg[5];
  job.rnn_activation = cfg[6] == 1 ? kRelu : cfg[6] == 2 ? kSigmoid : kTanh;
  job.has_clip = cfg[7];
  const int64_t steps = job.steps = xd->shape[0];
  const int64_t batch = job.batch = xd->shape[1];
  const int64_t width = job.width = xd->shape[2];
  const int64_t hidden = job.hidden = width / job.gates;
  job.limit = job.has_clip ? *FloatData(clip, "clip", 1) : 0.0f;
  job.xs = FloatData(x, "x", steps * batch * width);
  job.rt = FloatData(r_t, "R", hidden * width);
  job.p = has_peep ? FloatData(peep, "P", 3 * hidden) : nullptr;
  job.rb = job.linear_before_reset ? FloatData(rbh, "the recurrent bias", hidden) : nullptr;
  job.ys = Elements<float>(y);
  job.c = Elements<float>(c_out);
  float* h = Elements<float>(h_out);
  std::memcpy(h, FloatData(h0, "initial_h", batch * hidden), sizeof(float) * batch * hidden);
  if (job.kind == 0) {
    std::memcpy(job.c, FloatData(c0, "initial_c", batch * hidden), sizeof(float) * batch * hidden);
  } else {
    std::fill(job.c, job.c + batch * hidden, 0.0f);
  }
  std::fill(job.ys, job.ys + steps * batch * hidden, 0.0f);
  std::vector<int64_t> length(batch, steps);
  if (has_lens) {
    const int32_t* l = Elements<const int32_t>(lens);
    for (int64_t n = 0; n < batch; ++n) length[n] = std::min<int64_t>(std::max<int32_t>(l[n], 0), steps);
  }
  job.length = length.data();
  std::vector<float> other(batch * hidden), reset_h(batch * hidden);
  job.h[0] = h;
  job.h[1] = other.data();
  job.reset_h = reset_h.data();
  // On OpenMP's threads, the ones oneDNN's calls (the input projection) have just used: a
  // second pool would fight them for the cores. The runtimes size it (OMP_NUM_THREADS).
  if (batch * hidden * width >= kParallelStepWork && omp_get_max_threads() > 1 && ThreadsWelcome()) {
    std::unique_ptr<Stall[]> stalls(new Stall[omp_get_max_threads()]);
    bool gave_up = false;
#pragma omp parallel
    {
      const bool given_up = RecurrentSlice(job, omp_get_thread_num(), omp_get_num_threads(), stalls.get());
      if (omp_get_thread_num() == 0) gave_up = given_up;
    }
    AfterThreadedCall(gave_up);
  } else {
    RecurrentSlice(job, 0, 1, nullptr);
  }
  if (steps % 2 == 1) std::memcpy(h, other.data(), sizeof(float) * batch * hidden);
}

// ---------------------------------------------------------------------------------------------
// Loop and Scan outputs (compiler/converters/control_flow.py): each iteration's row goes into a
// buffer with room for more, where growing the output by concat copied all earlier rows on every
// iteration. The loop threads the buffer through its iterations and never reads a buffer it has
// passed on, so a buffer with room is written in place.

// A view of the first `rows` rows of `base`, sharing its memory (and keeping it alive).
struct RowsView {
  ffi::Tensor base;
  void AllocData(DLTensor* tensor) {
    const DLTensor* b = base.GetDLTensorPtr();
    tensor->data = b->data;
    tensor->byte_offset = b->byte_offset;
  }
  void FreeData(DLTensor*) {}
};

int64_t ScalarIndex(const ffi::Tensor& t, const char* what) {
  const DLTensor* d = t.GetDLTensorPtr();
  if (d->device.device_type != kDLCPU || d->dtype.code != kDLInt || d->dtype.bits != 64 ||
      NumElements(d) != 1) {
    TVM_FFI_THROW(ValueError) << what << " is not one int64 on the CPU";
  }
  return *Elements<const int64_t>(t);
}

// `rows` with `row` as row `index`: `rows` itself, written in place, when it has that row and
// rows of `row`'s shape; else a new buffer holding `rows`' rows, of `capacity` rows when that is
// more than `index` (a Scan knows its trip count), else of twice as many (at least 16).
ffi::Tensor RowsAppend(ffi::Tensor rows, ffi::Tensor row, ffi::Tensor index, ffi::Tensor rows_hint) {
  CheckCPUContiguous(rows, "edgec_rows_append");
  CheckCPUContiguous(row, "edgec_rows_append");
  const DLTensor* r = rows.GetDLTensorPtr();
  const DLTensor* v = row.GetDLTensorPtr();
  int64_t at = ScalarIndex(index, "edgec_rows_append: the row index");
  int64_t capacity = ScalarIndex(rows_hint, "edgec_rows_append: the row capacity");
  bool same_type = r->dtype.code == v->dtype.code && r->dtype.bits == v->dtype.bits &&
                   r->dtype.lanes == v->dtype.lanes;
  if (!same_type || r->ndim != v->ndim + 1 || at < 0) {
    TVM_FFI_THROW(ValueError) << "edgec_rows_append: row " << at << " does not fit the output";
  }
  bool same_rows = std::equal(v->shape, v->shape + v->ndim, r->shape + 1);
  if (!same_rows && r->shape[0] > 0) {
    TVM_FFI_THROW(ValueError) << "edgec_rows_append: a loop output's row changed shape between "
                              << "iterations";
  }
  size_t bytes = static_cast<size_t>(NumElements(v)) * ItemBytes(v);
  if (at < r->shape[0]) {
    std::memcpy(Elements<char>(rows) + at * bytes, Elements<const char>(row), bytes);
    return rows;
  }
  int64_t count = capacity > at ? capacity : std::max<int64_t>({at + 1, 2 * r->shape[0], 16});
  std::vector<int64_t> shape{count};
  shape.insert(shape.end(), v->shape, v->shape + v->ndim);
  ffi::Tensor grown = Empty(shape, v->dtype);
  if (r->shape[0] > 0) std::memcpy(Elements<char>(grown), Elements<const char>(rows), r->shape[0] * bytes);
  std::memcpy(Elements<char>(grown) + at * bytes, Elements<const char>(row), bytes);
  return grown;
}

// ONNX NonMaxSuppression where the box count is known only at run time (boxes kept after a
// score filter: TVM's kernel sizes its output from a static count). int64 rows (batch, class,
// box) per batch and class, in descending score (ties: lower box index first); a box is dropped
// when its IoU with one kept before exceeds iou_threshold; at most max_boxes per class (absent,
// empty or 0: none). `has_score_threshold`: drop boxes whose score is not above it. Follows
// onnx.reference's op (and onnxruntime's), boxes as corners or (center_point_box) centers.
struct Corners {
  double x0, x1, y0, y1;
};

Corners BoxCorners(const DLTensor* boxes, int64_t index, int64_t center_point_box) {
  double a = AsDouble(boxes, index * 4), b = AsDouble(boxes, index * 4 + 1);
  double c = AsDouble(boxes, index * 4 + 2), d = AsDouble(boxes, index * 4 + 3);
  if (center_point_box != 0) return {a - c / 2, a + c / 2, b - d / 2, b + d / 2};
  return {std::min(b, d), std::max(b, d), std::min(a, c), std::max(a, c)};
}

bool Overlaps(const Corners& p, const Corners& q, double iou_threshold) {
  double ix0 = std::max(p.x0, q.x0), ix1 = std::min(p.x1, q.x1);
  double iy0 = std::max(p.y0, q.y0), iy1 = std::min(p.y1, q.y1);
  if (ix1 <= ix0 || iy1 <= iy0) return false;
  double inter = (ix1 - ix0) * (iy1 - iy0);
  double area_p = (p.x1 - p.x0) * (p.y1 - p.y0), area_q = (q.x1 - q.x0) * (q.y1 - q.y0);
  double uni = area_p + area_q - inter;
  if (inter <= 0 || area_p <= 0 || area_q <= 0 || uni <= 0) return false;
  return inter / uni > iou_threshold;
}

void CheckFloat(const ffi::Tensor& x, const char* what) {
  const DLTensor* t = x.GetDLTensorPtr();
  if (t->dtype.code != kDLFloat || (t->dtype.bits != 32 && t->dtype.bits != 64)) {
    TVM_FFI_THROW(TypeError) << "edgec_nms: " << what << " must be float32 or float64";
  }
}

ffi::Tensor NonMaxSuppression(ffi::Tensor boxes, ffi::Tensor scores, ffi::Tensor max_boxes,
                              ffi::Tensor iou_threshold, ffi::Tensor score_threshold,
                              int64_t has_score_threshold, int64_t center_point_box) {
  for (const ffi::Tensor* t : {&boxes, &scores, &max_boxes, &iou_threshold, &score_threshold}) {
    CheckCPUContiguous(*t, "edgec_nms");
  }
  CheckFloat(boxes, "boxes");
  CheckFloat(scores, "scores");
  const DLTensor* b = boxes.GetDLTensorPtr();
  const DLTensor* s = scores.GetDLTensorPtr();
  if (b->ndim != 3 || b->shape[2] != 4 || s->ndim != 3 || s->shape[0] != b->shape[0] ||
      s->shape[2] != b->shape[1]) {
    TVM_FFI_THROW(ValueError) << "edgec_nms: boxes must be [batch, boxes, 4] and scores "
                              << "[batch, classes, boxes]";
  }
  const DLTensor* k = max_boxes.GetDLTensorPtr();
  int64_t limit = 0;  // read exactly: "no limit" is INT64_MAX, which a double rounds past
  if (NumElements(k) != 0) {
    limit = k->dtype.code == kDLInt && k->dtype.bits == 64
                ? *reinterpret_cast<const int64_t*>(ElementBytes(k, 0))
                : static_cast<int64_t>(std::min(AsDouble(k, 0), 9.0e18));
  }
  double iou = NumElements(iou_threshold.GetDLTensorPtr()) == 0
                   ? 0.0 : AsDouble(iou_threshold.GetDLTensorPtr(), 0);
  bool filter = has_score_threshold != 0 && NumElements(score_threshold.GetDLTensorPtr()) != 0;
  double floor = filter ? AsDouble(score_threshold.GetDLTensorPtr(), 0) : 0.0;
  int64_t batches = b->shape[0], count = b->shape[1], classes = s->shape[1];
  std::vector<int64_t> rows;  // (batch, class, box) triples
  std::vector<int64_t> order;
  std::vector<double> score(count);
  std::vector<Corners> corners(count);
  // The boxes kept so far in this class, by left edge: a candidate is tested only against those
  // whose left edge lies within the widest kept box's width of its own (the others cannot meet
  // it: Overlaps would say no). A detector's batched NMS offsets each class's boxes apart, so a
  // candidate meets a few hundred kept boxes, not tens of thousands. New boxes wait in `recent`
  // (each tested) and join the sorted array in merges, not one insertion each.
  constexpr size_t kMergeEvery = 64;
  auto by_left = [](const Corners& p, const Corners& q) { return p.x0 < q.x0; };
  std::vector<Corners> sorted_kept, recent_kept;
  for (int64_t n = 0; n < batches && limit > 0; ++n) {
    for (int64_t i = 0; i < count; ++i) corners[i] = BoxCorners(b, n * count + i, center_point_box);
    for (int64_t c = 0; c < classes; ++c) {
      int64_t base = (n * classes + c) * count;
      order.clear();
      for (int64_t i = 0; i < count; ++i) {
        score[i] = AsDouble(s, base + i);
        if (!filter || score[i] > floor) order.push_back(i);
      }
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t p, int64_t q) { return score[p] > score[q]; });
      sorted_kept.clear();
      recent_kept.clear();
      int64_t kept = 0;
      double widest = 0;
      for (int64_t i : order) {
        if (kept >= limit) break;
        const Corners& p = corners[i];
        double width = p.x1 - p.x0, height = p.y1 - p.y0;
        // A box with a NaN extent overlaps nothing (its area is NaN): kept, never indexed.
        bool indexable = !std::isnan(width) && !std::isnan(height);
        bool keep = true;
        if (indexable) {
          // Margin for the rounding of widths and of this subtraction: only adds candidates.
          double reach = widest + 1e-9 * (std::fabs(p.x0) + widest) + 1e-300;
          auto j = std::lower_bound(sorted_kept.begin(), sorted_kept.end(), p.x0 - reach,
                                    [](const Corners& q, double left) { return q.x0 < left; });
          for (; keep && j != sorted_kept.end() && j->x0 < p.x1; ++j) {
            keep = !Overlaps(p, *j, iou);
          }
          for (auto r = recent_kept.begin(); keep && r != recent_kept.end(); ++r) {
            keep = !Overlaps(p, *r, iou);
          }
        }
        if (!keep) continue;
        if (indexable) {
          widest = std::max(widest, width);
          recent_kept.push_back(p);
          if (recent_kept.size() == kMergeEvery) {
            std::sort(recent_kept.begin(), recent_kept.end(), by_left);
            size_t middle = sorted_kept.size();
            sorted_kept.insert(sorted_kept.end(), recent_kept.begin(), recent_kept.end());
            std::inplace_merge(sorted_kept.begin(), sorted_kept.begin() + middle,
                               sorted_kept.end(), by_left);
            recent_kept.clear();
          }
        }
        ++kept;
        rows.insert(rows.end(), {n, c, i});
      }
    }
  }
  int64_t selected = static_cast<int64_t>(rows.size() / 3);
  ffi::Tensor out = Empty({selected, 3}, DLDataType{kDLInt, 64, 1});
  std::copy(rows.begin(), rows.end(), static_cast<int64_t*>(out.data_ptr()));
  return out;
}

// The first `count` rows of `rows`, without a copy: the loop's stacked output.
ffi::Tensor RowsTake(ffi::Tensor rows, ffi::Tensor count) {
  const DLTensor* r = rows.GetDLTensorPtr();
  int64_t n = ScalarIndex(count, "edgec_rows_take: the row count");
  if (n == r->shape[0]) return rows;
  if (n < 0 || n > r->shape[0]) {
    TVM_FFI_THROW(ValueError) << "edgec_rows_take: " << n << " rows of " << r->shape[0];
  }
  std::vector<int64_t> shape(r->shape, r->shape + r->ndim);
  shape[0] = n;
  return ffi::Tensor::FromNDAlloc(RowsView{rows}, ffi::Shape(shape), r->dtype, r->device);
}

// The value of a one-element bool (or 8-bit integer) CPU tensor: a loop's condition.
bool ScalarTruth(const ffi::Tensor& t) {
  const DLTensor* d = t.GetDLTensorPtr();
  if (d->device.device_type != kDLCPU || d->dtype.bits != 8 || NumElements(d) != 1) {
    TVM_FFI_THROW(ValueError) << "edgec_loop: the loop condition is not one bool on the CPU";
  }
  return *Elements<const uint8_t>(t) != 0;
}

// A Loop's or Scan's iterations (compiler/importer/converters/control_flow.py), called by the VM
// with itself as context: (vm, step, limit, has_cond, n_state, state..., invariants...).
// `step(state..., invariants...)` is one iteration, a Relax function returning the next state;
// it runs while state[0] (the iteration count) < limit and, with `has_cond`, state[1] is true.
// Returns the final state. One native loop instead of a VM function recursing per iteration:
// no call frame, bound check or branch per iteration beyond the step's own.
void Loop(const ffi::AnyView* args, int32_t num_args, ffi::Any* result) {
  constexpr int kFixed = 5;
  if (num_args < kFixed) TVM_FFI_THROW(ValueError) << "edgec_loop: " << num_args << " arguments";
  int64_t limit = ScalarIndex(args[2].cast<ffi::Tensor>(), "edgec_loop: the trip limit");
  bool has_cond = args[3].cast<int64_t>() != 0;
  int64_t n_state = args[4].cast<int64_t>();
  if (n_state < (has_cond ? 2 : 1) || kFixed + n_state > num_args) {
    TVM_FFI_THROW(ValueError) << "edgec_loop: " << n_state << " state values of " << num_args;
  }
  // The VM's own closure call: the step may be bytecode or compiled code.
  ffi::Function invoke = ffi::Function::GetGlobalRequired("vm.builtin.invoke_closure");
  std::vector<ffi::Any> state(args + kFixed, args + kFixed + n_state);
  std::vector<ffi::AnyView> call(num_args - kFixed + 2);
  call[0] = args[0];
  call[1] = args[1];
  std::copy(args + kFixed + n_state, args + num_args, call.begin() + 2 + n_state);
  while (ScalarIndex(state[0].cast<ffi::Tensor>(), "edgec_loop: the iteration count") < limit &&
         (!has_cond || ScalarTruth(state[1].cast<ffi::Tensor>()))) {
    std::copy(state.begin(), state.end(), call.begin() + 2);
    ffi::Any next;
    invoke.CallPacked(call.data(), static_cast<int32_t>(call.size()), &next);
    ffi::Array<ffi::Any> values = next.cast<ffi::Array<ffi::Any>>();
    if (static_cast<int64_t>(values.size()) != n_state) {
      TVM_FFI_THROW(ValueError) << "edgec_loop: the step returned " << values.size() << " of "
                                << n_state << " state values";
    }
    for (int64_t k = 0; k < n_state; ++k) state[k] = values[k];
  }
  *result = ffi::Array<ffi::Any>(state.begin(), state.end());
}

}  // namespace

// -DEDGEC_ONLY_LISTED: only the exports named -DEDGEC_EXPORT_<symbol> (a library links the
// kernels its program calls; see shim_common.h), the others' code is then left out.
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_rows_append)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_rows_append, RowsAppend);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_rows_take)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_rows_take, RowsTake);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_nonzero)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_nonzero, NonZero);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_nms)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_nms, NonMaxSuppression);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_unique)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_unique, Unique);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_unique_axis)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_unique_axis, UniqueAxis);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_recurrent)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_recurrent, Recurrent);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_loop)
// Exported by hand: the driver takes a variable number of arguments, which a typed export cannot.
extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_edgec_loop(void*, const TVMFFIAny* args,
                                                       int32_t num_args, TVMFFIAny* result) {
  TVM_FFI_SAFE_CALL_BEGIN();
  Loop(reinterpret_cast<const tvm::ffi::AnyView*>(args), num_args,
       reinterpret_cast<tvm::ffi::Any*>(result));
  TVM_FFI_SAFE_CALL_END();
}
#endif
