// oneDNN kernels for quantized layers of edgec model libraries (edgec/compiler/transform/quantized.py writes
// the calls; compiled and linked like dnnl_shim.cc, against libdnnl.so.2, oneDNN 2.x). Compiled
// once per part, -DEDGEC_Q8_DENSE and -DEDGEC_Q8_CONV, with only the exports the program calls
// (-DEDGEC_ONLY_LISTED, shim_common.h): each exported wrapper alone is 10-40 KB of code.
//
// Weights arrive as int8 with one float scale per output channel (symmetric, zero point 0):
//
//   edgec_q8_dense_w8(x[..., K] f32, w[K, N] s8, w_scale[N], b[N], flags, wid, out[..., N])
//   edgec_q8_dense_i8(x, w, w_scale, b, x_scale, x_zero, flags, wid, out)
//   edgec_q8_conv2d_w8(x, w[O, I, KH, KW] s8, w_scale[O], b[O], sh, sw, pt, pl, pb, pr, dh, dw,
//                      groups, flags, wid, out)
//   edgec_q8_conv2d_i8(x, w, w_scale, b, x_scale, x_zero, <ints as conv2d_w8>, out)
//   edgec_q8_conv2d_add_w8(x, w, w_scale, b, residual, <ints as conv2d_w8>, out)
//   edgec_q8_conv2d_add_i8(x, w, w_scale, b, x_scale, x_zero, residual, <ints>, out)
//
// The `_add` forms add a residual of the output's shape and layout before the relu, as
// dnnl_shim.cc's conv2d_add (a batch-norm-folded ResNet block's last convolution).
//
// `_w8` (weight-only): the weight is dequantized and packed for the fp32 primitive on its first
// call, once per weight id, so the library stores one byte per weight and every later call
// costs what fp32 costs. `_i8`: the activation is quantized to u8 (x_scale, x_zero: calibrated,
// static; x_scale <= 0: from this call's min and max, dynamic) and the primitive multiplies u8 by
// s8 with s32 accumulation (AVX512-VNNI / AVX2 VNNI kernels where the CPU has them), writing f32
// out = out_scale[n] * (acc - x_zero * sum_k w) + b. Activations are NCHW, NCHW8c, NCHW16c or
// NHWC-as-[N,1,H,W,C] as in dnnl_shim.cc.

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "dnnl_common.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace {

void Check(const DLTensor* t, int code, int bits, const char* what) {
  if (t->device.device_type != kDLCPU) {
    TVM_FFI_THROW(ValueError) << "edgec int8: " << what << " is not on the CPU";
  }
  if (t->dtype.code != code || t->dtype.bits != bits || t->dtype.lanes != 1) {
    TVM_FFI_THROW(ValueError) << "edgec int8: " << what << " has the wrong dtype";
  }
}

template <typename T>
T* Data(const DLTensor* t) {
  return reinterpret_cast<T*>(static_cast<char*>(t->data) + t->byte_offset);
}

memory::dims Dims(const DLTensor* t) { return memory::dims(t->shape, t->shape + t->ndim); }

memory::desc ActivationDesc(const DLTensor* t, dt type, const char* what) {
  if (t->ndim == 4) return memory::desc(Dims(t), type, tag::nchw);
  if (t->ndim == 5) {
    memory::dims dims = {t->shape[0], t->shape[1] * t->shape[4], t->shape[2], t->shape[3]};
    if (t->shape[4] == 8) return memory::desc(dims, type, tag::nChw8c);
    if (t->shape[4] == 16) return memory::desc(dims, type, tag::nChw16c);
    if (t->shape[1] == 1) return memory::desc(dims, type, tag::nhwc);
  }
  TVM_FFI_THROW(ValueError) << "edgec int8: " << what
                            << " must be NCHW, NCHW8c, NCHW16c, or NHWC as [N, 1, H, W, C]";
  return memory::desc();
}

// A per-thread byte buffer of at least `bytes`.
void* Scratch(int slot, size_t bytes) {
  thread_local std::vector<uint8_t> buffers[4];
  std::vector<uint8_t>& buffer = buffers[slot];
  if (buffer.size() < bytes + 64) buffer.resize(bytes + 64);
  uintptr_t p = reinterpret_cast<uintptr_t>(buffer.data());
  return reinterpret_cast<void*>((p + 63) & ~uintptr_t(63));
}

// The per-call loops around an int8 matmul, in SSE2 on x86-64 (every x86-64 CPU has it; the
// shim is built for the baseline ISA): at -O2 GCC vectorizes neither a float min/max reduction
// nor a clamp-and-narrow loop, and generic vector types came out as scalar code with stack
// spills. Scalar, those loops made int8-static 1.15x and int8-dynamic 1.35x fp32 on the zoo
// transformer (perf: Params, Quantize and the epilogue were 14% of int8-dynamic's time).

// Activation quantization parameters: the calibrated ones, or (scale <= 0) this tensor's range,
// widened to hold 0 so that zero (padding) is exact.
void Params(const float* x, int64_t n, double scale_in, int64_t zero_in, float* scale,
            int32_t* zero) {
  if (scale_in > 0) {
    *scale = static_cast<float>(scale_in);
    *zero = static_cast<int32_t>(zero_in);
    return;
  }
  float lo = 0.f, hi = 0.f;
  int64_t i = 0;
#if defined(__SSE2__)
  __m128 lo_v[4], hi_v[4];  // four chains, so the loop is not one long dependency
  for (int j = 0; j < 4; ++j) lo_v[j] = hi_v[j] = _mm_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 4; ++j) {
      __m128 v = _mm_loadu_ps(x + i + 4 * j);
      lo_v[j] = _mm_min_ps(lo_v[j], v);
      hi_v[j] = _mm_max_ps(hi_v[j], v);
    }
  }
  float lanes[4];
  _mm_storeu_ps(lanes, _mm_min_ps(_mm_min_ps(lo_v[0], lo_v[1]), _mm_min_ps(lo_v[2], lo_v[3])));
  for (float v : lanes) lo = std::min(lo, v);
  _mm_storeu_ps(lanes, _mm_max_ps(_mm_max_ps(hi_v[0], hi_v[1]), _mm_max_ps(hi_v[2], hi_v[3])));
  for (float v : lanes) hi = std::max(hi, v);
#endif
  for (; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  float s = (hi - lo) / 255.f;
  if (!(s > 0.f)) s = 1.f;
  *scale = s;
  *zero = static_cast<int32_t>(std::nearbyint(-lo / s));
}

void Quantize(const float* x, int64_t n, float scale, int32_t zero, uint8_t* q) {
  const float inv = 1.f / scale;
  const float z = static_cast<float>(zero);
  // Round half up by truncation after clamping (no libm call).
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128 inv_v = _mm_set1_ps(inv), z_v = _mm_set1_ps(z), half = _mm_set1_ps(0.5f);
  const __m128 low = _mm_setzero_ps(), high = _mm_set1_ps(255.f);
  auto lanes = [&](const float* p) {
    __m128 v = _mm_add_ps(_mm_add_ps(_mm_mul_ps(_mm_loadu_ps(p), inv_v), z_v), half);
    return _mm_cvttps_epi32(_mm_min_ps(_mm_max_ps(v, low), high));
  };
  for (; i + 16 <= n; i += 16) {
    __m128i lo = _mm_packs_epi32(lanes(x + i), lanes(x + i + 4));
    __m128i hi = _mm_packs_epi32(lanes(x + i + 8), lanes(x + i + 12));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm_packus_epi16(lo, hi));
  }
#endif
  for (; i < n; ++i) {
    float v = x[i] * inv + z + 0.5f;
    v = v < 0.f ? 0.f : (v > 255.f ? 255.f : v);
    q[i] = static_cast<uint8_t>(static_cast<int32_t>(v));
  }
}

// out[i, j] = out[i, j] * x_scale + b[j], then relu if asked: a dynamic layer's epilogue.
void ScaleBiasRelu(float* out, int64_t m, int64_t n, float x_scale, const float* b, bool relu) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = out + i * n;
    int64_t j = 0;
#if defined(__SSE2__)
    const __m128 s_v = _mm_set1_ps(x_scale), zero_v = _mm_setzero_ps();
    for (; j + 4 <= n; j += 4) {
      __m128 v = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(row + j), s_v), _mm_loadu_ps(b + j));
      _mm_storeu_ps(row + j, relu ? _mm_max_ps(v, zero_v) : v);
    }
#endif
    for (; j < n; ++j) {
      float v = row[j] * x_scale + b[j];
      row[j] = relu && v < 0.f ? 0.f : v;
    }
  }
}

// Packed weights by (weight id, layout): dequantized to f32 (weight-only) or kept s8.
memory PackWeights(int64_t id, const memory::desc& packed_md, const int8_t* w,
                   const float* w_scale, const memory::desc& user_md, int64_t channels,
                   int channel_axis_stride_outer, bool dequantize) {
  static std::mutex mutex;
  static std::unordered_map<std::string, memory> cache;
  std::string key = std::to_string(id) + (dequantize ? "/f/" : "/q/") +
                    std::string(reinterpret_cast<const char*>(&packed_md.data),
                                sizeof(packed_md.data));
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  memory packed(packed_md, Engine());
  const int64_t total = static_cast<int64_t>(user_md.get_size()) /
                        static_cast<int64_t>(dequantize ? sizeof(float) : sizeof(int8_t));
  if (dequantize) {
    // channel_axis_stride_outer: 1 when the channel is the last axis ([K, N]), 0 when it is
    // the first ([O, ...]).
    std::vector<float> plain(total);
    const int64_t inner = total / channels;
    for (int64_t i = 0; i < total; ++i) {
      int64_t c = channel_axis_stride_outer ? i % channels : i / inner;
      plain[i] = static_cast<float>(w[i]) * w_scale[c];
    }
    memory user(user_md, Engine(), plain.data());
    Reorder(user_md, packed_md).execute(Stream(), user, packed);
    Stream().wait();
  } else {
    memory user(user_md, Engine(), const_cast<int8_t*>(w));
    Reorder(user_md, packed_md).execute(Stream(), user, packed);
    Stream().wait();
  }
  std::lock_guard<std::mutex> lock(mutex);
  return cache.emplace(key, packed).first->second;
}

// A primitive's packed weights by id: the fast path, without building PackWeights' string key.
struct WeightSlot {
  std::mutex mutex;
  std::unordered_map<int64_t, memory> by_id;

  template <typename Pack>
  memory Get(int64_t id, Pack pack) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = by_id.find(id);
      if (it != by_id.end()) return it->second;
    }
    memory weights = pack();
    std::lock_guard<std::mutex> lock(mutex);
    return by_id.emplace(id, weights).first->second;
  }
};

int64_t FloatBits(float v) {
  int32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// ---------------------------------------------------------------------------------------------
// Dense (compiled with EDGEC_Q8_DENSE: a library links only the parts its program calls)

#ifdef EDGEC_Q8_DENSE

// Below this many multiply-adds an int8 matmul takes oneDNN's AVX512-VNNI kernel, not its AMX
// one: on the zoo transformer (16x64x64 to 32x128x64) AMX made int8-static 1.08x slower than
// fp32 and VNNI 1.01x, the same run; a process whose threads use AMX tiles also pays to save
// and restore their state, which slowed its fp32 kernels too. Convolutions keep AMX (squeezenet:
// int8-static 0.70x fp32 with it, 0.79x without).
constexpr int64_t kAmxMinMacs = int64_t(1) << 22;

// The next implementation of `pd` that does not use AMX, if there is one.
template <typename PrimitiveDesc>
void SkipAmx(PrimitiveDesc* pd) {
  PrimitiveDesc first = *pd;
  while (std::string(pd->impl_info_str()).find("amx") != std::string::npos) {
    if (!pd->next_impl()) {
      *pd = first;
      return;
    }
  }
}

struct DenseEntry {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
  WeightSlot weights;
  std::vector<float> out_scales;
  // int8: the zero point's term, x_zero * sum_k w[k, n], goes into the bias (no zero-point
  // attribute, so no run-time zero-point argument); static layers fold it, and the division by
  // the output scales, into `folded_bias` once.
  std::once_flag once;
  std::vector<int32_t> column_sums;
  std::vector<float> folded_bias;
  MemoryPool memories;  // data (f32, or quantized u8), bias, output
};

// Output scales must be fixed when the primitive is made: with run-time scales oneDNN 2.6 drops
// from its brgemm (AMX / VNNI) matmul to a generic GEMM that repacks the weights on every call
// (measured 2x slower than fp32 on the zoo transformer). Static layers fix x_scale * w_scale and
// the zero point; dynamic ones fix w_scale only, with no relu in the primitive, and this
// function applies the call's x_scale, then the bias and relu, to the output.
void Dense(DLTensor* src, DLTensor* weight, DLTensor* w_scale, DLTensor* bias, bool int8,
           double x_scale_in, int64_t x_zero_in, int64_t flags, int64_t weight_id,
           DLTensor* dst) {
  Check(src, kDLFloat, 32, "dense data");
  Check(weight, kDLInt, 8, "dense weight");
  Check(w_scale, kDLFloat, 32, "dense weight scale");
  Check(bias, kDLFloat, 32, "dense bias");
  Check(dst, kDLFloat, 32, "dense output");
  if (weight->ndim != 2 || src->ndim < 1 || src->shape[src->ndim - 1] != weight->shape[0]) {
    TVM_FFI_THROW(ValueError) << "edgec int8: dense needs data [..., K] and weight [K, N]";
  }
  const int64_t k = weight->shape[0], n = weight->shape[1];
  int64_t m = 1;
  for (int i = 0; i + 1 < src->ndim; ++i) m *= src->shape[i];
  if (m == 0 || n == 0) return;
  const bool dynamic = int8 && !(x_scale_in > 0);
  const float* w_scales = Data<float>(w_scale);
  const float* x = Data<float>(src);
  float* out = Data<float>(dst);
  float x_scale = static_cast<float>(x_scale_in);
  int32_t x_zero = static_cast<int32_t>(x_zero_in);
  if (dynamic) Params(x, m * k, 0.0, 0, &x_scale, &x_zero);

  ThreadsScope threads(m * k * n < kSerialMacs);
  std::vector<int64_t> key = {m, k, n, flags, int8 + dynamic, threads.serial()};
  if (int8) key.insert(key.end(), {weight_id, dynamic ? 0 : FloatBits(x_scale), dynamic ? 0 : x_zero});
  static PrimitiveCache<DenseEntry> cache;
  auto entry = cache.Get(key, [&]() {
    auto entry = std::make_shared<DenseEntry>();
    dnnl::post_ops ops;
    if (!dynamic) AppendActivation(ops, flags);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    dt src_t = dt::f32, w_t = dt::f32;
    if (int8) {
      src_t = dt::u8;
      w_t = dt::s8;
      entry->out_scales.assign(w_scales, w_scales + n);
      if (!dynamic) {
        for (float& v : entry->out_scales) v *= x_scale;
      }
      attr.set_output_scales(1 << 1, entry->out_scales);
    }
    dnnl::matmul::desc desc(memory::desc({m, k}, src_t, tag::ab), memory::desc({k, n}, w_t, tag::any),
                            memory::desc({1, n}, dt::f32, tag::ab),
                            memory::desc({m, n}, dt::f32, tag::ab));
    entry->pd = dnnl::matmul::primitive_desc(desc, attr, Engine());
    if (int8 && m * k * n < kAmxMinMacs) SkipAmx(&entry->pd);
    entry->primitive = dnnl::matmul(entry->pd);
    entry->memories.Init(
        {entry->pd.src_desc(), entry->pd.bias_desc(), entry->pd.dst_desc()});
    return entry;
  });
  const auto& pd = entry->pd;
  memory weights = entry->weights.Get(weight_id, [&]() {
    return PackWeights(weight_id, pd.weights_desc(), Data<int8_t>(weight), w_scales,
                       memory::desc({k, n}, int8 ? dt::s8 : dt::f32, tag::ab), n, 1, !int8);
  });
  MemoryPool::Lease mem = entry->memories.Take();
  const float* b = Data<float>(bias);
  const void* src_data = x;
  const void* bias_data = b;
  if (int8) {
    std::call_once(entry->once, [&]() {
      const int8_t* w = Data<int8_t>(weight);
      entry->column_sums.assign(n, 0);
      for (int64_t i = 0; i < k; ++i) {
        for (int64_t j = 0; j < n; ++j) entry->column_sums[j] += w[i * n + j];
      }
      if (!dynamic) {
        // oneDNN 2.x applies the output scales after the bias: dst = scale * (acc + bias),
        // and acc sums q * w with q = x / x_scale + x_zero.
        entry->folded_bias.resize(n);
        for (int64_t j = 0; j < n; ++j) {
          entry->folded_bias[j] = b[j] / entry->out_scales[j] -
                                  static_cast<float>(x_zero) * entry->column_sums[j];
        }
      }
    });
    uint8_t* q = static_cast<uint8_t*>(Scratch(0, m * k));
    Quantize(x, m * k, x_scale, x_zero, q);
    src_data = q;
    float* folded = entry->folded_bias.data();
    if (dynamic) {  // this call's zero point; x_scale and the bias come after, in ScaleBiasRelu
      folded = static_cast<float*>(Scratch(1, n * sizeof(float)));
      for (int64_t j = 0; j < n; ++j) {
        folded[j] = -static_cast<float>(x_zero) * entry->column_sums[j];
      }
    }
    bias_data = folded;
  }
  Execute(entry->primitive, {{DNNL_ARG_SRC, mem.Over(0, src_data)},
                             {DNNL_ARG_WEIGHTS, weights.get()},
                             {DNNL_ARG_BIAS, mem.Over(1, bias_data)},
                             {DNNL_ARG_DST, mem.Over(2, out)}});
  Stream().wait();
  if (dynamic) {
    const FusedActivation a = FusedActivationOf(flags);
    ScaleBiasRelu(out, m, n, x_scale, b, a.kind == Act::kRelu);
    if (a.kind != Act::kNone && a.kind != Act::kRelu) {
      for (int64_t i = 0; i < m * n; ++i) out[i] = Activate(out[i], a);
    }
  }
}

void DenseW8(DLTensor* src, DLTensor* weight, DLTensor* w_scale, DLTensor* bias, int64_t flags,
             int64_t weight_id, DLTensor* dst) {
  try {
    Dense(src, weight, w_scale, bias, false, 0.0, 0, flags, weight_id, dst);
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << "edgec int8 dense: " << e.what();
  }
}

void DenseI8(DLTensor* src, DLTensor* weight, DLTensor* w_scale, DLTensor* bias, double x_scale,
             int64_t x_zero, int64_t flags, int64_t weight_id, DLTensor* dst) {
  try {
    Dense(src, weight, w_scale, bias, true, x_scale, x_zero, flags, weight_id, dst);
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << "edgec int8 dense: " << e.what();
  }
}

#endif  // EDGEC_Q8_DENSE

// ---------------------------------------------------------------------------------------------
// Convolution (compiled with EDGEC_Q8_CONV)

#ifdef EDGEC_Q8_CONV

struct ConvEntry {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward primitive;
  memory::desc user_src, user_dst, user_weights;
  bool reorder_src = false, reorder_dst = false;
  dnnl::reorder src_in, dst_out, residual_in;
  std::vector<float> out_scales;
  WeightSlot weights;
  // The caller's data, output, residual; the bias; the reordered data, output, residual.
  enum { kSrc, kDst, kResidual, kBias, kSrcPacked, kDstPacked, kResidualPacked };
  MemoryPool memories;
};

// attrs: stride h, w; pad top, left, bottom, right; dilation h, w; groups; flags
std::shared_ptr<ConvEntry> MakeConv(const DLTensor* src, const DLTensor* weight,
                                    const float* w_scale, bool int8, float x_scale,
                                    int32_t x_zero, const int64_t* a, const DLTensor* dst,
                                    bool residual) {
  const dt src_t = int8 ? dt::u8 : dt::f32;
  const dt w_t = int8 ? dt::s8 : dt::f32;
  memory::desc user_src = ActivationDesc(src, dt::f32, "conv2d data");
  memory::desc user_dst = ActivationDesc(dst, dt::f32, "conv2d output");
  const int64_t groups = a[8], flags = a[9];
  memory::dims w = Dims(weight);  // O, I/groups, KH, KW
  memory::dims wdims = w;
  memory::desc user_weights(w, w_t, tag::oihw);
  if (groups > 1) {
    wdims = {groups, w[0] / groups, w[1], w[2], w[3]};
    user_weights = memory::desc(wdims, w_t, tag::goihw);
  }
  auto entry = std::make_shared<ConvEntry>();
  if (int8) {
    // Fixed per layer (calibrated), so they are attributes of the primitive, not run-time args.
    entry->out_scales.resize(w[0]);
    for (int64_t o = 0; o < w[0]; ++o) entry->out_scales[o] = x_scale * w_scale[o];
  }
  // Post-ops run after the output scales: dst = relu(scale * (acc + bias) [+ residual]).
  auto make = [&](const memory::desc& dst_md, bool with_residual) {
    dnnl::primitive_attr attr;
    dnnl::post_ops ops;
    if (with_residual) ops.append_binary(dnnl::algorithm::binary_add, dst_md);
    AppendActivation(ops, flags);
    attr.set_post_ops(ops);
    if (int8) {
      attr.set_output_scales(1 << 1, entry->out_scales);
      if (x_zero != 0) attr.set_zero_points(DNNL_ARG_SRC, 0, {x_zero});
    }
    dnnl::convolution_forward::desc desc(
        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
        memory::desc(user_src.dims(), src_t, tag::any), memory::desc(wdims, w_t, tag::any),
        memory::desc({w[0]}, dt::f32, tag::x), dst_md, {a[0], a[1]}, {a[6] - 1, a[7] - 1},
        {a[2], a[3]}, {a[4], a[5]});
    return dnnl::convolution_forward::primitive_desc(desc, attr, Engine());
  };
  // Writing the caller's layout directly saves a reorder per call, unless only the reference
  // kernel takes it.
  entry->pd = make(user_dst, false);
  if (std::string(entry->pd.impl_info_str()).rfind("ref", 0) == 0) {
    entry->pd = make(memory::desc(user_dst.dims(), dt::f32, tag::any), false);
  }
  // The residual (a binary post-op input) takes the layout the primitive chose without it.
  if (residual) entry->pd = make(entry->pd.dst_desc(), true);
  entry->primitive = dnnl::convolution_forward(entry->pd);
  entry->user_src = user_src;
  entry->user_dst = user_dst;
  entry->user_weights = user_weights;
  entry->reorder_src = entry->pd.src_desc() != user_src;
  entry->reorder_dst = entry->pd.dst_desc() != user_dst;
  if (int8) {
    // Quantize and change layout in one reorder: q = x / x_scale + x_zero, saturated to u8.
    dnnl::primitive_attr quant;
    quant.set_output_scales(0, {1.f / x_scale});
    if (x_zero != 0) quant.set_zero_points(DNNL_ARG_DST, 0, {x_zero});
    entry->src_in = dnnl::reorder(dnnl::reorder::primitive_desc(
        Engine(), user_src, Engine(), entry->pd.src_desc(), quant));
  } else if (entry->reorder_src) {
    entry->src_in = Reorder(user_src, entry->pd.src_desc());
  }
  if (entry->reorder_dst) {
    entry->dst_out = Reorder(entry->pd.dst_desc(), user_dst);
    if (residual) entry->residual_in = Reorder(user_dst, entry->pd.dst_desc());
  }
  const auto& pd = entry->pd;
  entry->memories.Init({user_src, user_dst, user_dst, pd.bias_desc(), pd.src_desc(),
                        pd.dst_desc(), pd.dst_desc()});
  return entry;
}

// `residual`: added before the relu (the _add forms), else null.
void Conv2d(DLTensor* src, DLTensor* weight, DLTensor* w_scale, DLTensor* bias, bool int8,
            double x_scale_in, int64_t x_zero_in, DLTensor* residual, const int64_t* attrs,
            int64_t weight_id, DLTensor* dst) {
  Check(src, kDLFloat, 32, "conv2d data");
  if (residual != nullptr) {
    Check(residual, kDLFloat, 32, "conv2d residual");
    if (Numel(residual) != Numel(dst) || residual->ndim != dst->ndim) {
      TVM_FFI_THROW(ValueError) << "edgec int8: conv2d residual must have the output's shape";
    }
  }
  Check(weight, kDLInt, 8, "conv2d weight");
  Check(w_scale, kDLFloat, 32, "conv2d weight scale");
  Check(bias, kDLFloat, 32, "conv2d bias");
  Check(dst, kDLFloat, 32, "conv2d output");
  if (weight->ndim != 4) TVM_FFI_THROW(ValueError) << "edgec int8: conv2d weight must be OIHW";
  if (Numel(src) == 0 || Numel(dst) == 0) return;
  if (int8 && !(x_scale_in > 0)) {
    TVM_FFI_THROW(ValueError) << "edgec int8: conv2d needs a calibrated activation scale";
  }
  const float x_scale = static_cast<float>(x_scale_in);
  const int32_t x_zero = static_cast<int32_t>(x_zero_in);

  int64_t macs = weight->shape[1] * weight->shape[2] * weight->shape[3] * Numel(dst);
  ThreadsScope threads(macs < kSerialConvMacs);
  std::vector<int64_t> key(attrs, attrs + 10);
  key.insert(key.end(), {int8, weight_id, FloatBits(x_scale), x_zero, residual != nullptr,
                         threads.serial()});
  AppendShape(&key, src);
  AppendShape(&key, weight);
  AppendShape(&key, dst);
  static PrimitiveCache<ConvEntry> cache;
  const float* w_scales = Data<float>(w_scale);
  auto entry = cache.Get(key, [&]() {
    return MakeConv(src, weight, w_scales, int8, x_scale, x_zero, attrs, dst, residual != nullptr);
  });
  const auto& pd = entry->pd;
  memory weights = entry->weights.Get(weight_id, [&]() {
    return PackWeights(weight_id, pd.weights_desc(), Data<int8_t>(weight), w_scales,
                       entry->user_weights, weight->shape[0], 0, !int8);
  });
  MemoryPool::Lease m = entry->memories.Take();
  dnnl_memory_t src_m = m.Over(ConvEntry::kSrc, Data<float>(src));
  dnnl_memory_t dst_m = m.Over(ConvEntry::kDst, Data<float>(dst));
  dnnl_memory_t src_p = src_m, dst_p = dst_m;
  if (int8 || entry->reorder_src) {
    src_p = m.Over(ConvEntry::kSrcPacked, Scratch(1, pd.src_desc().get_size()));
    Execute(entry->src_in, {{DNNL_ARG_FROM, src_m}, {DNNL_ARG_TO, src_p}});
  }
  if (entry->reorder_dst) {
    dst_p = m.Over(ConvEntry::kDstPacked, Scratch(2, pd.dst_desc().get_size()));
  }
  float* bias_data = Data<float>(bias);
  std::vector<float> scaled_bias;
  if (int8) {
    // oneDNN 2.x applies the output scales after the bias: dst = scale * (acc + bias).
    scaled_bias.resize(entry->out_scales.size());
    for (size_t o = 0; o < scaled_bias.size(); ++o) {
      scaled_bias[o] = bias_data[o] / entry->out_scales[o];
    }
    bias_data = scaled_bias.data();
  }
  dnnl_memory_t bias_m = m.Over(ConvEntry::kBias, bias_data);
  if (residual == nullptr) {
    Execute(entry->primitive, {{DNNL_ARG_SRC, src_p}, {DNNL_ARG_WEIGHTS, weights.get()},
                               {DNNL_ARG_BIAS, bias_m}, {DNNL_ARG_DST, dst_p}});
  } else {
    // The residual, a binary post-op's input, in the layout the primitive writes.
    dnnl_memory_t residual_m = m.Over(ConvEntry::kResidual, Data<float>(residual));
    if (entry->reorder_dst) {
      dnnl_memory_t reordered =
          m.Over(ConvEntry::kResidualPacked, Scratch(3, pd.dst_desc().get_size()));
      Execute(entry->residual_in, {{DNNL_ARG_FROM, residual_m}, {DNNL_ARG_TO, reordered}});
      residual_m = reordered;
    }
    Execute(entry->primitive, {{DNNL_ARG_SRC, src_p}, {DNNL_ARG_WEIGHTS, weights.get()},
                               {DNNL_ARG_BIAS, bias_m}, {DNNL_ARG_DST, dst_p},
                               {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, residual_m}});
  }
  if (entry->reorder_dst) Execute(entry->dst_out, {{DNNL_ARG_FROM, dst_p}, {DNNL_ARG_TO, dst_m}});
  Stream().wait();
}

void Conv2dW8(DLTensor* src, DLTensor* weight, DLTensor* w_scale, DLTensor* bias, int64_t sh,
              int64_t sw, int64_t pt, int64_t pl, int64_t pb, int64_t pr, int64_t dh, int64_t dw,
              int64_t groups, int64_t flags, int64_t weight_id, DLTensor* dst) {
  const int64_t attrs[] = {sh, sw, pt, pl, pb, pr, dh, dw, groups, flags};
  try {
    Conv2d(src, weight, w_scale, bias, false, 0.0, 0, nullptr, attrs, weight_id, dst);
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << "edgec int8 conv2d: " << e.what();
  }
}

void Conv2dAddW8(DLTensor* src, DLTensor* weight, DLTensor* w_scale, DLTensor* bias,
                 DLTensor* residual, int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t pb,
                 int64_t pr, int64_t dh, int64_t dw, int64_t groups, int64_t flags,
                 int64_t weight_id, DLTensor* dst) {
  const int64_t attrs[] = {sh, sw, pt, pl, pb, pr, dh, dw, groups, flags};
  try {
    Conv2d(src, weight, w_scale, bias, false, 0.0, 0, residual, attrs, weight_id, dst);
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << "edgec int8 conv2d_add: " << e.what();
  }
}

void Conv2dI8(DLTensor* src, DLTensor* weight, DLTensor* w_scale, DLTensor* bias, double x_scale,
              int64_t x_zero, int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t pb,
              int64_t pr, int64_t dh, int64_t dw, int64_t groups, int64_t flags,
              int64_t weight_id, DLTensor* dst) {
  const int64_t attrs[] = {sh, sw, pt, pl, pb, pr, dh, dw, groups, flags};
  try {
    Conv2d(src, weight, w_scale, bias, true, x_scale, x_zero, nullptr, attrs, weight_id, dst);
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << "edgec int8 conv2d: " << e.what();
  }
}

void Conv2dAddI8(DLTensor* src, DLTensor* weight, DLTensor* w_scale, DLTensor* bias,
                 double x_scale, int64_t x_zero, DLTensor* residual, int64_t sh, int64_t sw,
                 int64_t pt, int64_t pl, int64_t pb, int64_t pr, int64_t dh, int64_t dw,
                 int64_t groups, int64_t flags, int64_t weight_id, DLTensor* dst) {
  const int64_t attrs[] = {sh, sw, pt, pl, pb, pr, dh, dw, groups, flags};
  try {
    Conv2d(src, weight, w_scale, bias, true, x_scale, x_zero, residual, attrs, weight_id, dst);
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << "edgec int8 conv2d_add: " << e.what();
  }
}

#endif  // EDGEC_Q8_CONV

}  // namespace

#ifdef EDGEC_Q8_DENSE
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_q8_dense_w8)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_q8_dense_w8, DenseW8);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_q8_dense_i8)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_q8_dense_i8, DenseI8);
#endif
#endif
#ifdef EDGEC_Q8_CONV
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_q8_conv2d_w8)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_q8_conv2d_w8, Conv2dW8);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_q8_conv2d_i8)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_q8_conv2d_i8, Conv2dI8);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_q8_conv2d_add_w8)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_q8_conv2d_add_w8, Conv2dAddW8);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_q8_conv2d_add_i8)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_q8_conv2d_add_i8, Conv2dAddI8);
#endif
#endif
