// What edgec's library shims share, whatever the library (dnnl_shim.cc and dnnl_int8.cc through
// dnnl_common.h, xnnpack_shim.cc): a cache of library objects (primitives, operators with their
// packed weights) keyed by shapes, attributes and weight ids, and tensor helpers. C++, DLPack and
// tvm_ffi's errors only. Its definitions are in an anonymous namespace, so each shim keeps its own
// caches.
//
// Each exported wrapper is 8-30 KB of code (its typed argument unpacking), so a shim compiled with
// -DEDGEC_ONLY_LISTED defines only the exports named -DEDGEC_EXPORT_<symbol>: a library links
// the functions its program calls (edgec/compiler/native.py), not every one.
#pragma once

#include <dlpack/dlpack.h>
#include <tvm/ffi/error.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {

// The flags of a conv2d or dense call, shared with library_offload/rules.py: relu last (after the
// bias and the residual add), or another activation in bits 4-7, clip's upper bound (its lower is
// 0) as float32 bits in bits 32-63.
constexpr int64_t kRelu = 1;

enum class Act { kNone, kRelu, kClip, kSigmoid, kTanh, kSwish, kHardSwish, kGeluErf, kGeluTanh };

struct FusedActivation {
  Act kind = Act::kNone;
  float upper = 0.f;  // kClip's
};

FusedActivation FusedActivationOf(int64_t flags) {
  FusedActivation a;
  if (flags & kRelu) a.kind = Act::kRelu;
  const int64_t code = (flags >> 4) & 15;  // rules.ACTIVATIONS' index + 1
  if (code > 0) a.kind = static_cast<Act>(code + 1);
  if (a.kind == Act::kClip) {
    const uint32_t bits = static_cast<uint32_t>(static_cast<uint64_t>(flags) >> 32);
    std::memcpy(&a.upper, &bits, sizeof(a.upper));
  }
  if (code > 7) TVM_FFI_THROW(ValueError) << "edgec: unknown activation code " << code;
  return a;
}

// One value through `a`: for the paths that apply it outside the library.
float Activate(float v, const FusedActivation& a) {
  switch (a.kind) {
    case Act::kNone: return v;
    case Act::kRelu: return v < 0.f ? 0.f : v;
    case Act::kClip: return v < 0.f ? 0.f : (v > a.upper ? a.upper : v);
    case Act::kSigmoid: return 1.f / (1.f + std::exp(-v));
    case Act::kTanh: return std::tanh(v);
    case Act::kSwish: return v / (1.f + std::exp(-v));
    case Act::kHardSwish: return v * std::min(std::max(v + 3.f, 0.f), 6.f) / 6.f;
    case Act::kGeluErf: return 0.5f * v * (1.f + std::erf(v * 0.70710678f));
    case Act::kGeluTanh:
      return 0.5f * v * (1.f + std::tanh(0.79788456f * (v + 0.044715f * v * v * v)));
  }
  return v;
}

// Library objects by a key of every shape, attribute and weight id they depend on. A model sees
// a bounded set of them; the cache is emptied should it ever pass a bound (entries in use stay
// alive through their shared_ptr).
template <typename Entry>
class PrimitiveCache {
 public:
  template <typename Make>
  std::shared_ptr<Entry> Get(const std::vector<int64_t>& key, Make make) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = cache_.find(key);
      if (it != cache_.end()) return it->second;
    }
    std::shared_ptr<Entry> entry = make();
    std::lock_guard<std::mutex> lock(mutex_);
    if (cache_.size() >= kMaxEntries) cache_.clear();
    return cache_.emplace(key, entry).first->second;
  }

 private:
  static constexpr size_t kMaxEntries = 4096;
  struct Hash {
    size_t operator()(const std::vector<int64_t>& v) const {
      size_t h = 1469598103934665603ull;
      for (int64_t x : v) h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
      return h;
    }
  };
  std::mutex mutex_;
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<Entry>, Hash> cache_;
};

void AppendShape(std::vector<int64_t>* key, const DLTensor* t) {
  key->push_back(t->ndim);
  key->insert(key->end(), t->shape, t->shape + t->ndim);
}

// Whether a tensor has no elements (its data is never read; its strides may be anything).
bool Empty(const DLTensor* t) {
  for (int i = 0; i < t->ndim; ++i) {
    if (t->shape[i] == 0) return true;
  }
  return false;
}

int64_t Numel(const DLTensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

// Whether a tensor is laid out compactly in row-major order (no strides, or the compact ones).
bool Compact(const DLTensor* t) {
  if (t->strides == nullptr || Empty(t)) return true;
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expected) return false;
    expected *= t->shape[i];
  }
  return true;
}

// A float32 tensor on the CPU, laid out compactly; else a ValueError naming the shim (`shim`,
// e.g. "edgec dnnl") and the argument (`what`, then `role` if given: "conv2d" "data"). An empty
// tensor holds no data: whatever strides it reports (numpy's for a 0-sized batch are not the
// compact ones) are never used. The message is built only on failure: a small model's library
// calls take a few microseconds each.
void CheckFloat32(const DLTensor* t, const char* shim, const char* what,
                  const char* role = nullptr) {
  const char* problem = nullptr;
  if (t->device.device_type != kDLCPU) {
    problem = "is not on the CPU";
  } else if (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1) {
    problem = "is not float32";
  } else if (!Compact(t)) {
    problem = "is not compact";
  }
  if (problem != nullptr) {
    TVM_FFI_THROW(ValueError) << shim << ": " << what << (role ? " " : "") << (role ? role : "")
                              << " " << problem;
  }
}

// The operands of a conv2d or dense call: each float32 on the CPU, named "<op> data", "<op>
// weight"... in errors (`shim` as in CheckFloat32); `residual` may be absent. With
// `weight_scale` (a weight-only int8 layer), the weight is int8 and its scales float32.
void CheckOperands(const char* shim, const char* op, const DLTensor* src, const DLTensor* weight,
                   const DLTensor* bias, const DLTensor* dst, const DLTensor* residual = nullptr,
                   const DLTensor* weight_scale = nullptr) {
  CheckFloat32(src, shim, op, "data");
  if (weight_scale == nullptr) {
    CheckFloat32(weight, shim, op, "weight");
  } else {
    if (weight->device.device_type != kDLCPU || weight->dtype.code != kDLInt ||
        weight->dtype.bits != 8 || weight->dtype.lanes != 1 || !Compact(weight)) {
      TVM_FFI_THROW(ValueError) << shim << ": " << op << " weight is not a compact int8 CPU tensor";
    }
    CheckFloat32(weight_scale, shim, op, "weight scale");
  }
  CheckFloat32(bias, shim, op, "bias");
  CheckFloat32(dst, shim, op, "output");
  if (residual != nullptr) CheckFloat32(residual, shim, op, "residual");
}

// A float32 tensor's first element.
float* FloatData(const DLTensor* t) {
  return reinterpret_cast<float*>(static_cast<char*>(t->data) + t->byte_offset);
}

}  // namespace
