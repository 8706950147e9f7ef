// XNNPACK kernels for edgec model libraries on Arm: convolution and dense matmul over DLTensor.
//
// The Relax program calls these by name through `call_dps_packed`, with the argument lists of
// the oneDNN shim (dnnl_shim.cc; edgec/compiler/transform/library_offload.py writes the calls). This file
// is compiled -fPIC with the target's cross compiler (edgec/compiler/native.py) and linked into
// the exported model library against libXNNPACK.so.0 and libpthreadpool.so.0 (Debian's
// libxnnpack-dev and libpthreadpool-dev for arm64, XNNPACK of February 2022: operators are
// created with their weights, then set up with the input's shape and pointers, then run).
//
// An XNNPACK operator owns its weights packed for the machine's kernels at creation. Constant
// weights arrive with a 63-bit id derived from their content at compile time: one operator is
// created per (id, bias, attributes) on the first call and serves every shape and call after
// (setup takes the batch and spatial size), so weights are packed once, never per call. An operator's
// setup and run change it, so each runs under its own mutex; one VM (or several) may call from
// any thread.
//
// Weight-only int8 layers (`edgec_xnn_q8_*_w8`, written by edgec/compiler/transform/quantized.py) pass the
// weight as int8 with one float scale per output channel, after the weight: it is dequantized
// when the operator is made, so the library stores a byte per weight and every call costs what
// fp32 costs (as dnnl_int8.cc's `_w8` functions on x86).
//
// Activations are NHWC as [N, 1, H, W, C] (the layout library_dispatch keeps between XNNPACK
// calls) or plain NCHW (the model's input image, or every tensor when the layout pass is off),
// which is transposed through a scratch buffer. Weights are OIHW (as in ONNX) and transposed to
// XNNPACK's [groups, O/groups, KH, KW, I/groups] before the operator packs them.

#include <dlpack/dlpack.h>
#include <pthreadpool.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <unistd.h>
#include <xnnpack.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "shim_common.h"

namespace {

// XNNPACK's operators clamp their output, so relu is the one activation this shim fuses
// (DispatchRules.activations); the matcher sends it no other.
void CheckReluOnly(int64_t flags, const char* op) {
  const Act kind = FusedActivationOf(flags).kind;
  if (kind != Act::kNone && kind != Act::kRelu) {
    TVM_FFI_THROW(ValueError) << "edgec xnnpack: " << op << " cannot fuse activation "
                              << static_cast<int>(kind) << "; recompile with this edgec";
  }
}

const char* StatusName(xnn_status status) {
  switch (status) {
    case xnn_status_success: return "success";
    case xnn_status_uninitialized: return "uninitialized";
    case xnn_status_invalid_parameter: return "invalid parameter";
    case xnn_status_invalid_state: return "invalid state";
    case xnn_status_unsupported_parameter: return "unsupported parameter";
    case xnn_status_unsupported_hardware: return "unsupported hardware";
    case xnn_status_out_of_memory: return "out of memory";
  }
  return "unknown error";
}

void Check(xnn_status status, const char* what) {
  if (status != xnn_status_success) {
    TVM_FFI_THROW(RuntimeError) << "edgec xnnpack: " << what << " failed: " << StatusName(status);
  }
}

void Initialize() {
  static std::once_flag once;
  static xnn_status status = xnn_status_success;
  std::call_once(once, []() { status = xnn_initialize(nullptr); });
  Check(status, "xnn_initialize");
}

// XNNPACK's thread pool: OMP_NUM_THREADS threads when set (both edgec runtimes set it to their
// thread count, as for oneDNN's pool), else one per core. TVM's own kernels stay serial in such
// libraries (codegen.py), so the two pools do not fight over the cores.
pthreadpool_t Pool() {
  static pthreadpool_t pool = []() {
    const char* env = std::getenv("OMP_NUM_THREADS");
    size_t threads = env != nullptr ? static_cast<size_t>(std::max(0L, std::atol(env))) : 0;
    return pthreadpool_create(threads);  // 0: one per core
  }();
  return pool;
}

// A per-thread buffer of at least `floats` floats plus XNN_EXTRA_BYTES.
float* Scratch(int slot, size_t floats) {
  thread_local std::vector<float> buffers[2];
  std::vector<float>& buffer = buffers[slot];
  size_t want = floats + XNN_EXTRA_BYTES / sizeof(float) + 1;
  if (buffer.size() < want) buffer.resize(want);
  return buffer.data();
}

// An input XNNPACK may read from: `data` itself, or a copy in a scratch buffer with slack.
// XNNPACK's kernels read up to XNN_EXTRA_BYTES past the end of an input (never writing there,
// never using what they read). Tensors TVM allocates, and the callers' inputs, have no such
// slack guaranteed; a read past the end faults only when it crosses into the next page, which
// may be unmapped. So the copy is made only when the tensor ends within XNN_EXTRA_BYTES of a
// page boundary (a read inside the page that holds the last byte cannot fault).
const float* WithSlack(const float* data, size_t floats, int slot) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t end = reinterpret_cast<uintptr_t>(data + floats);
  if (floats == 0 || (end - 1) / page == (end - 1 + XNN_EXTRA_BYTES) / page) return data;
  float* copy = Scratch(slot, floats);
  std::memcpy(copy, data, floats * sizeof(float));
  return copy;
}

// NCHW [N, C, H, W] <-> NHWC [N, H, W, C].
void NchwToNhwc(const float* from, float* to, int64_t n, int64_t c, int64_t hw) {
  for (int64_t b = 0; b < n; ++b, from += c * hw, to += c * hw) {
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t p = 0; p < hw; ++p) to[p * c + ch] = from[ch * hw + p];
    }
  }
}

void NhwcToNchw(const float* from, float* to, int64_t n, int64_t c, int64_t hw) {
  for (int64_t b = 0; b < n; ++b, from += c * hw, to += c * hw) {
    for (int64_t p = 0; p < hw; ++p) {
      for (int64_t ch = 0; ch < c; ++ch) to[ch * hw + p] = from[p * c + ch];
    }
  }
}

// N, C, H, W of an activation, NCHW (4-D) or NHWC as [N, 1, H, W, C] (5-D); `nhwc` says which.
struct Activation {
  int64_t n, c, h, w;
  bool nhwc;
};

Activation Layout(const DLTensor* t, const char* what) {
  if (t->ndim == 4) return {t->shape[0], t->shape[1], t->shape[2], t->shape[3], false};
  if (t->ndim == 5 && t->shape[1] == 1) {
    return {t->shape[0], t->shape[4], t->shape[2], t->shape[3], true};
  }
  TVM_FFI_THROW(ValueError) << "edgec xnnpack: " << what
                            << " must be NCHW or NHWC as [N, 1, H, W, C]";
  return {};
}

// A key for a bias: the operator packs it with the weight, and the weight id covers the
// weight only (oneDNN's shim takes the bias per call). FNV-1a over its bytes.
int64_t BiasKey(const DLTensor* bias) {
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(FloatData(bias));
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0, size = static_cast<size_t>(Numel(bias)) * sizeof(float); i < size; ++i) {
    h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 1);
}

// A weight-only int8 weight's float32 values: each int8 value times its output channel's scale
// (`channel_axis`: 0 for OIHW, 1 for [K, N]).
std::vector<float> Dequantize(const DLTensor* weight, const DLTensor* scale, int channel_axis) {
  const int64_t channels = weight->shape[channel_axis];
  if (Numel(scale) != channels) {
    TVM_FFI_THROW(ValueError) << "edgec xnnpack: an int8 weight needs one scale per output channel";
  }
  int64_t inner = 1;
  for (int i = channel_axis + 1; i < weight->ndim; ++i) inner *= weight->shape[i];
  const int8_t* q = reinterpret_cast<const int8_t*>(static_cast<const char*>(weight->data) + weight->byte_offset);
  const float* s = FloatData(scale);
  std::vector<float> values(static_cast<size_t>(Numel(weight)));
  for (size_t i = 0; i < values.size(); ++i) values[i] = q[i] * s[(static_cast<int64_t>(i) / inner) % channels];
  return values;
}

// An operator and the lock its setup and run take.
struct Operator {
  xnn_operator_t op = nullptr;
  std::mutex mutex;
  ~Operator() {
    if (op != nullptr) xnn_delete_operator(op);
  }
};

// ---------------------------------------------------------------------------------------------
// Convolution

std::shared_ptr<Operator> MakeConv(const DLTensor* weight, const float* w, const float* bias,
                                   const int64_t* attrs, bool clamp_relu) {
  // attrs: stride h, w; pad top, left, bottom, right; dilation h, w; groups; flags
  const int64_t out = weight->shape[0], group_in = weight->shape[1];
  const int64_t kh = weight->shape[2], kw = weight->shape[3], groups = attrs[8];
  if (groups <= 0 || out % groups != 0) {
    TVM_FFI_THROW(ValueError) << "edgec xnnpack: conv2d groups do not divide the output channels";
  }
  // OIHW [O, I/g, KH, KW] -> [O, KH, KW, I/g]: XNNPACK's [g, O/g, KH, KW, I/g] in one piece.
  std::vector<float> ohwi(out * kh * kw * group_in);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < group_in; ++i) {
      for (int64_t k = 0; k < kh * kw; ++k) {
        ohwi[(o * kh * kw + k) * group_in + i] = w[(o * group_in + i) * kh * kw + k];
      }
    }
  }
  auto entry = std::make_shared<Operator>();
  const float lo = clamp_relu ? 0.f : -std::numeric_limits<float>::infinity();
  Check(xnn_create_convolution2d_nhwc_f32(
            static_cast<uint32_t>(attrs[2]), static_cast<uint32_t>(attrs[5]),
            static_cast<uint32_t>(attrs[4]), static_cast<uint32_t>(attrs[3]),
            static_cast<uint32_t>(kh), static_cast<uint32_t>(kw),
            static_cast<uint32_t>(attrs[0]), static_cast<uint32_t>(attrs[1]),
            static_cast<uint32_t>(attrs[6]), static_cast<uint32_t>(attrs[7]),
            static_cast<uint32_t>(groups), static_cast<size_t>(group_in),
            static_cast<size_t>(out / groups), static_cast<size_t>(group_in * groups),
            static_cast<size_t>(out), ohwi.data(), bias, lo,
            std::numeric_limits<float>::infinity(), 0, &entry->op),
        "creating a conv2d operator");
  return entry;
}

// `weight_scale`: the weight is int8 (weight-only int8), else float32.
void Conv2d(DLTensor* src, DLTensor* weight, DLTensor* weight_scale, DLTensor* bias,
            DLTensor* residual, const int64_t* attrs, int64_t weight_id, DLTensor* dst) {
  CheckOperands("edgec xnnpack", "conv2d", src, weight, bias, dst, residual, weight_scale);
  if (weight->ndim != 4) TVM_FFI_THROW(ValueError) << "edgec xnnpack: conv2d weight must be OIHW";
  Activation in = Layout(src, "conv2d data"), out = Layout(dst, "conv2d output");
  if (in.c != weight->shape[1] * attrs[8] || out.c != weight->shape[0] || in.n != out.n) {
    TVM_FFI_THROW(ValueError) << "edgec xnnpack: conv2d shapes do not match its weight";
  }
  if (Empty(src) || Empty(dst)) return;
  Initialize();

  CheckReluOnly(attrs[9], "conv2d");
  // The relu goes into the operator's output clamp unless a residual is added after it.
  const bool relu = (attrs[9] & kRelu) != 0;
  const bool clamp_relu = relu && residual == nullptr;
  std::vector<int64_t> key(attrs, attrs + 10);
  key.push_back(clamp_relu);
  key.push_back(weight_id);
  key.push_back(BiasKey(bias));
  key.push_back(weight_scale != nullptr);
  AppendShape(&key, weight);
  static PrimitiveCache<Operator> cache;
  auto entry = cache.Get(key, [&]() {
    if (weight_scale == nullptr) return MakeConv(weight, FloatData(weight), FloatData(bias), attrs, clamp_relu);
    const std::vector<float> w = Dequantize(weight, weight_scale, 0);
    return MakeConv(weight, w.data(), FloatData(bias), attrs, clamp_relu);
  });

  const size_t in_size = static_cast<size_t>(Numel(src));
  const size_t out_size = static_cast<size_t>(Numel(dst));
  const float* x = FloatData(src);
  if (!in.nhwc) {
    float* copy = Scratch(0, in_size);  // with XNN_EXTRA_BYTES of slack: see WithSlack
    NchwToNhwc(x, copy, in.n, in.c, in.h * in.w);
    x = copy;
  } else {
    x = WithSlack(x, in_size, 0);
  }
  float* y = out.nhwc ? FloatData(dst) : Scratch(1, out_size);
  {
    std::lock_guard<std::mutex> lock(entry->mutex);
    Check(xnn_setup_convolution2d_nhwc_f32(entry->op, static_cast<size_t>(in.n),
                                           static_cast<size_t>(in.h), static_cast<size_t>(in.w),
                                           x, y, Pool()),
          "setting up conv2d");
    Check(xnn_run_operator(entry->op, Pool()), "running conv2d");
  }
  float* result = FloatData(dst);
  if (!out.nhwc) NhwcToNchw(y, result, out.n, out.c, out.h * out.w);
  if (residual != nullptr) {  // the residual has the output's layout
    const float* r = FloatData(residual);
    if (relu) {
      for (size_t i = 0; i < out_size; ++i) result[i] = std::max(result[i] + r[i], 0.f);
    } else {
      for (size_t i = 0; i < out_size; ++i) result[i] += r[i];
    }
  }
}

// conv2d(data, weight[O, I/groups, KH, KW], bias[O], stride h, w, pad top, left, bottom, right,
//        dilation h, w, groups, flags, weight id, out): out = act(conv(data, weight) + bias)
void Conv2dExport(DLTensor* src, DLTensor* weight, DLTensor* bias, int64_t stride_h,
                  int64_t stride_w, int64_t pad_top, int64_t pad_left, int64_t pad_bottom,
                  int64_t pad_right, int64_t dilation_h, int64_t dilation_w, int64_t groups,
                  int64_t flags, int64_t weight_id, DLTensor* dst) {
  const int64_t attrs[] = {stride_h, stride_w, pad_top, pad_left, pad_bottom,
                           pad_right, dilation_h, dilation_w, groups, flags};
  Conv2d(src, weight, nullptr, bias, nullptr, attrs, weight_id, dst);
}

// q8_conv2d_w8(data, weight[O, I/groups, KH, KW] int8, weight_scale[O], bias, <attributes as
// conv2d>, weight id, out): conv2d of the dequantized weight.
void Conv2dW8Export(DLTensor* src, DLTensor* weight, DLTensor* weight_scale, DLTensor* bias,
                    int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_left,
                    int64_t pad_bottom, int64_t pad_right, int64_t dilation_h, int64_t dilation_w,
                    int64_t groups, int64_t flags, int64_t weight_id, DLTensor* dst) {
  const int64_t attrs[] = {stride_h, stride_w, pad_top, pad_left, pad_bottom,
                           pad_right, dilation_h, dilation_w, groups, flags};
  Conv2d(src, weight, weight_scale, bias, nullptr, attrs, weight_id, dst);
}

// conv2d_add(data, weight, bias, residual, <attributes as conv2d>, out):
// out = act(conv(data, weight) + bias + residual); the residual has the output's shape.
void Conv2dAddExport(DLTensor* src, DLTensor* weight, DLTensor* bias, DLTensor* residual,
                     int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_left,
                     int64_t pad_bottom, int64_t pad_right, int64_t dilation_h,
                     int64_t dilation_w, int64_t groups, int64_t flags, int64_t weight_id,
                     DLTensor* dst) {
  const int64_t attrs[] = {stride_h, stride_w, pad_top, pad_left, pad_bottom,
                           pad_right, dilation_h, dilation_w, groups, flags};
  Conv2d(src, weight, nullptr, bias, residual, attrs, weight_id, dst);
}

// q8_conv2d_add_w8(data, weight int8, weight_scale, bias, residual, <attributes as conv2d>,
// weight id, out): conv2d_add of the dequantized weight.
void Conv2dAddW8Export(DLTensor* src, DLTensor* weight, DLTensor* weight_scale, DLTensor* bias,
                       DLTensor* residual, int64_t stride_h, int64_t stride_w, int64_t pad_top,
                       int64_t pad_left, int64_t pad_bottom, int64_t pad_right, int64_t dilation_h,
                       int64_t dilation_w, int64_t groups, int64_t flags, int64_t weight_id,
                       DLTensor* dst) {
  const int64_t attrs[] = {stride_h, stride_w, pad_top, pad_left, pad_bottom,
                           pad_right, dilation_h, dilation_w, groups, flags};
  Conv2d(src, weight, weight_scale, bias, residual, attrs, weight_id, dst);
}

// ---------------------------------------------------------------------------------------------
// Dense

// dense(data[..., K], weight[K, N], bias[N], flags, weight id, out[..., N]):
// out = act(data @ weight + bias), the leading dims of data flattened into M.
void DenseImpl(DLTensor* src, DLTensor* weight, DLTensor* weight_scale, DLTensor* bias,
               int64_t flags, int64_t weight_id, DLTensor* dst) {
  CheckOperands("edgec xnnpack", "dense", src, weight, bias, dst, nullptr, weight_scale);
  if (weight->ndim != 2 || src->ndim < 1 || src->shape[src->ndim - 1] != weight->shape[0]) {
    TVM_FFI_THROW(ValueError) << "edgec xnnpack: dense needs data [..., K] and weight [K, N]";
  }
  const int64_t k = weight->shape[0], n = weight->shape[1];
  int64_t m = 1;
  for (int i = 0; i + 1 < src->ndim; ++i) m *= src->shape[i];
  if (m == 0 || n == 0) return;
  CheckReluOnly(flags, "dense");
  Initialize();

  static PrimitiveCache<Operator> cache;
  auto entry = cache.Get({k, n, flags, weight_id, BiasKey(bias), weight_scale != nullptr}, [&]() {
    auto entry = std::make_shared<Operator>();
    const float lo = (flags & kRelu) ? 0.f : -std::numeric_limits<float>::infinity();
    std::vector<float> dequantized;
    if (weight_scale != nullptr) dequantized = Dequantize(weight, weight_scale, 1);
    // XNN_FLAG_TRANSPOSE_WEIGHTS: the kernel is [K, N] (input channels first), as edgec's is.
    Check(xnn_create_fully_connected_nc_f32(
              static_cast<size_t>(k), static_cast<size_t>(n), static_cast<size_t>(k),
              static_cast<size_t>(n), weight_scale != nullptr ? dequantized.data() : FloatData(weight),
              FloatData(bias), lo,
              std::numeric_limits<float>::infinity(), XNN_FLAG_TRANSPOSE_WEIGHTS, &entry->op),
          "creating a dense operator");
    return entry;
  });
  const float* x = WithSlack(FloatData(src), static_cast<size_t>(m * k), 0);
  std::lock_guard<std::mutex> lock(entry->mutex);
  Check(xnn_setup_fully_connected_nc_f32(entry->op, static_cast<size_t>(m), x, FloatData(dst), Pool()),
        "setting up dense");
  Check(xnn_run_operator(entry->op, Pool()), "running dense");
}

void Dense(DLTensor* src, DLTensor* weight, DLTensor* bias, int64_t flags, int64_t weight_id,
           DLTensor* dst) {
  DenseImpl(src, weight, nullptr, bias, flags, weight_id, dst);
}

// q8_dense_w8(data, weight[K, N] int8, weight_scale[N], bias, flags, weight id, out): dense of
// the dequantized weight.
void DenseW8(DLTensor* src, DLTensor* weight, DLTensor* weight_scale, DLTensor* bias,
             int64_t flags, int64_t weight_id, DLTensor* dst) {
  DenseImpl(src, weight, weight_scale, bias, flags, weight_id, dst);
}

}  // namespace

#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_xnn_conv2d)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_xnn_conv2d, Conv2dExport);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_xnn_conv2d_add)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_xnn_conv2d_add, Conv2dAddExport);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_xnn_dense)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_xnn_dense, Dense);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_xnn_q8_conv2d_w8)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_xnn_q8_conv2d_w8, Conv2dW8Export);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_xnn_q8_conv2d_add_w8)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_xnn_q8_conv2d_add_w8, Conv2dAddW8Export);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_xnn_q8_dense_w8)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_xnn_q8_dense_w8, DenseW8);
#endif
