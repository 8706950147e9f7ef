// Kernels for Relax ops whose results have data-dependent shapes.
//
// TVM 0.27 lowers `relax.nonzero` and `relax.unique` to calls of "relax.run.nonzero" and
// "relax.run.unique", functions registered by TVM's *Python* package: a runtime-only install or a
// C/C++ host does not have them. edgec renames those calls to the functions below
// (edgec/compiler/runtime_kernels.py) and links this file into every model library that needs
// them, so the artifact runs wherever libtvm_runtime does. Semantics follow numpy, as TVM's
// Python versions do.

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <vector>

namespace {

namespace ffi = tvm::ffi;

// Host allocations aligned like TVM's own, so compiled kernels may use aligned loads on them.
struct AlignedCPUAlloc {
  void AllocData(DLTensor* tensor) {
    size_t bytes = (tensor->dtype.bits * tensor->dtype.lanes + 7) / 8;
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
  size_t size = (t->dtype.bits * t->dtype.lanes + 7) / 8;
  return static_cast<const uint8_t*>(t->data) + t->byte_offset + i * size;
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

// numpy.unique over the flattened input (axis=None), with TVM's "sorted=0" reordering by first
// occurrence. Returns the outputs the flags ask for, in numpy's order: values, index, inverse,
// counts. Values keep the input's dtype; the others are int64.
ffi::Array<ffi::Tensor> UniqueImpl(const ffi::Tensor& x, bool sorted, bool want_index,
                                   bool want_inverse, bool want_counts) {
  CheckCPUContiguous(x, "edgec_unique");
  const DLTensor* t = x.GetDLTensorPtr();
  int64_t n = NumElements(t);
  size_t size = (t->dtype.bits * t->dtype.lanes + 7) / 8;
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return AsDouble(t, a) < AsDouble(t, b); });
  // Groups of equal values in sorted order; first occurrence of each.
  std::vector<int64_t> first, counts;
  std::vector<int64_t> group_of(n);
  for (int64_t k = 0; k < n; ++k) {
    int64_t i = order[k];
    if (k == 0 || AsDouble(t, i) != AsDouble(t, order[k - 1])) {
      first.push_back(i);
      counts.push_back(0);
    }
    counts.back() += 1;
    group_of[i] = static_cast<int64_t>(first.size()) - 1;
  }
  int64_t groups = static_cast<int64_t>(first.size());
  std::vector<int64_t> rank(groups);  // output position of each sorted group
  std::iota(rank.begin(), rank.end(), 0);
  if (!sorted) {
    std::vector<int64_t> by_first(groups);
    std::iota(by_first.begin(), by_first.end(), 0);
    std::sort(by_first.begin(), by_first.end(), [&](int64_t a, int64_t b) { return first[a] < first[b]; });
    for (int64_t pos = 0; pos < groups; ++pos) rank[by_first[pos]] = pos;
  }
  ffi::Tensor values = Empty({groups}, t->dtype);
  ffi::Tensor index = Empty({groups}, DLDataType{kDLInt, 64, 1});
  ffi::Tensor count = Empty({groups}, DLDataType{kDLInt, 64, 1});
  for (int64_t g = 0; g < groups; ++g) {
    std::memcpy(static_cast<uint8_t*>(values.data_ptr()) + rank[g] * size, ElementBytes(t, first[g]), size);
    static_cast<int64_t*>(index.data_ptr())[rank[g]] = first[g];
    static_cast<int64_t*>(count.data_ptr())[rank[g]] = counts[g];
  }
  ffi::Tensor inverse = Empty({n}, DLDataType{kDLInt, 64, 1});
  for (int64_t i = 0; i < n; ++i) static_cast<int64_t*>(inverse.data_ptr())[i] = rank[group_of[i]];
  ffi::Array<ffi::Tensor> outputs{values};
  if (want_index) outputs.push_back(index);
  if (want_inverse) outputs.push_back(inverse);
  if (want_counts) outputs.push_back(count);
  return outputs;
}

ffi::Any Unique(ffi::Tensor x, bool sorted, bool return_index, bool return_inverse,
                bool return_counts) {
  ffi::Array<ffi::Tensor> outputs = UniqueImpl(x, sorted, return_index, return_inverse, return_counts);
  if (outputs.size() == 1) return outputs[0];
  return outputs;
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_nonzero, NonZero);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_unique, Unique);
