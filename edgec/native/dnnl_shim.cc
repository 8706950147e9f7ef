// oneDNN kernels for edgec model libraries: convolution and dense matmul over DLTensor.
//
// The Relax program calls these by name through `call_dps_packed`; each function's argument
// list is documented in edgec/compiler/transform/library_offload.py, which writes the calls. This file is
// compiled -fPIC (edgec/compiler/native.py) and linked into the exported model library, against
// libdnnl.so.2 (oneDNN 2.x, Debian's libdnnl-dev).
//
// Shapes are concrete only at run time (models have symbolic dims), so a primitive is created on
// the first call with a shape and cached. Constant weights arrive with a 63-bit id derived from
// their content at compile time: they are reordered into the primitive's preferred layout once
// per (id, layout), shared by every shape and call, never repacked per call. Mutexes guard the
// caches; execution runs outside them, so one VM (or several) may call from any thread.
//
// Activations are plain NCHW (4-D) or blocked (5-D [N, C/b, H, W, b]: nChw8c, nChw16c, or NHWC
// as one block of all channels), read from the tensors' shapes. A plain tensor lets the
// primitive pick its layout and is reordered in and out. ONEDNN_VERBOSE=1 shows, per call, the
// implementation and layouts oneDNN chose.

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "dnnl_common.h"

namespace {

// Flags shared with library_offload/rules.py (kRelu and the activations: shim_common.h).
// bf16 arithmetic (`--quantize bf16`): the weights packed as bf16 once, the input converted to
// bf16 per call, products summed in f32 and the output written in f32, as the accuracy guard
// simulated it (edgec/stages/quantize/simulate.py).
constexpr int64_t kBf16 = 2;

// The data type of a call's input and weights.
dt InputType(int64_t flags) { return (flags & kBf16) ? dt::bf16 : dt::f32; }

// `md` holding elements of type `type`, its layout unchanged.
memory::desc WithType(memory::desc md, dt type) {
  md.data.data_type = static_cast<dnnl_data_type_t>(type);
  return md;
}

memory::dims Dims(const DLTensor* t) { return memory::dims(t->shape, t->shape + t->ndim); }

memory::desc ActivationDesc(const DLTensor* t, const char* what) {
  if (t->ndim == 4) return memory::desc(Dims(t), dt::f32, tag::nchw);
  if (t->ndim == 5) {
    memory::dims dims = {t->shape[0], t->shape[1] * t->shape[4], t->shape[2], t->shape[3]};
    if (t->shape[4] == 8) return memory::desc(dims, dt::f32, tag::nChw8c);
    if (t->shape[4] == 16) return memory::desc(dims, dt::f32, tag::nChw16c);
    if (t->shape[1] == 1) return memory::desc(dims, dt::f32, tag::nhwc);
  }
  TVM_FFI_THROW(ValueError) << "edgec dnnl: " << what
                            << " must be NCHW, NCHW8c, NCHW16c, or NHWC as [N, 1, H, W, C]";
  return memory::desc();
}

bool IsReference(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
}

bool IsGemmOrReference(const dnnl::primitive_desc_base& pd) {
  return IsReference(pd) || std::string(pd.impl_info_str()).find("gemm") != std::string::npos;
}

// Constant weights reordered into a layout, by (content id, layout): identical weights of
// different calls share one copy.
memory PackWeights(int64_t id, const memory::desc& user_md, const float* data,
                   const memory::desc& packed_md) {
  static std::mutex mutex;
  static std::unordered_map<std::string, memory> cache;
  std::string key = std::to_string(id) + '/' +
                    std::string(reinterpret_cast<const char*>(&packed_md.data),
                                sizeof(packed_md.data));
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  memory user(user_md, Engine(), const_cast<float*>(data));
  memory packed(packed_md, Engine());
  Reorder(user_md, packed_md).execute(Stream(), user, packed);
  Stream().wait();
  std::lock_guard<std::mutex> lock(mutex);
  return cache.emplace(key, packed).first->second;
}

// Winograd convolutions need this many input and output channels (below, direct is faster).
constexpr int64_t kMinWinogradChannels = 32;

// At most this many groups run ungrouped (the zeros multiply the work by the group count).
constexpr int64_t kMaxUngroup = 8;

// Grouped OIHW weights [O, I/g, KH, KW] as the ungrouped [O, I, KH, KW] they equal: zeros
// outside each group's block of input channels.
std::vector<float> UngroupWeights(const float* data, const memory::dims& dense, int64_t groups) {
  const int64_t out = dense[0], in = dense[1], kernel = dense[2] * dense[3];
  const int64_t group_in = in / groups, group_out = out / groups;
  std::vector<float> result(out * in * kernel, 0.f);
  for (int64_t o = 0; o < out; ++o) {
    const int64_t first_in = (o / group_out) * group_in;
    std::copy(data + o * group_in * kernel, data + (o + 1) * group_in * kernel,
              result.data() + (o * in + first_in) * kernel);
  }
  return result;
}

// What every cached primitive keeps: its weights' layouts and, per weight id, the packed copy.
struct WeightSlot {
  memory::desc user;
  memory::desc packed;
  int64_t ungroup = 1;  // > 1: grouped weights run ungrouped (UngroupWeights) with this many groups
  std::mutex mutex;
  std::unordered_map<int64_t, memory> by_id;

  memory Get(int64_t id, const float* data) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = by_id.find(id);
      if (it != by_id.end()) return it->second;
    }
    std::vector<float> dense;
    if (ungroup > 1) {
      dense = UngroupWeights(data, user.dims(), ungroup);
      data = dense.data();
    }
    memory weights = PackWeights(id, user, data, packed);
    std::lock_guard<std::mutex> lock(mutex);
    return by_id.emplace(id, weights).first->second;
  }
};

// A per-thread buffer of at least `bytes`, for an activation in a primitive's layout.
float* Scratch(int slot, size_t bytes) {
  thread_local std::vector<float> buffers[3];
  std::vector<float>& buffer = buffers[slot];
  if (buffer.size() * sizeof(float) < bytes) buffer.resize(bytes / sizeof(float) + 1);
  return buffer.data();
}

// ---------------------------------------------------------------------------------------------
// Convolution

struct ConvEntry {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward primitive;
  WeightSlot weights;
  memory::desc user_src, user_dst;
  bool reorder_src = false, reorder_dst = false;
  // The residual is added as a sum post-op (Winograd kernels take no binary post-op): it is
  // copied into the output, in the primitive's layout, before the primitive runs.
  bool residual_as_sum = false;
  dnnl::reorder src_in, residual_in, dst_out;
  // The caller's data, output, bias and residual; the reordered data, output and residual.
  enum { kSrc, kDst, kBias, kResidual, kSrcPacked, kDstPacked, kResidualPacked };
  MemoryPool memories;
  // A grouped 1x1 convolution run as one GEMM per group (GroupGemmConv) instead of `primitive`:
  // the data and output NCHW, reordered from and to the caller's layouts where they differ.
  // Then `epilogue` adds the bias (and the residual) and applies the activation, in place.
  bool group_gemm = false;
  memory::desc plain_src, plain_dst;
  dnnl::binary epilogue;
};

// Grouped 1x1 convolutions (stride 1, no padding) whose groups are not whole 8-channel blocks run
// as one GEMM per (image, group) over NCHW data, on AVX2 machines: oneDNN 2.6's grouped kernel
// there pads each group to whole blocks and wants NHWC; shufflenet's 4 groups of 68 channels took
// it 115-210 us a layer against 53-66 us for the GEMMs (2 threads, Zen 3; onnxruntime 72 us).
// AVX-512 machines keep oneDNN's direct kernel for such groups (1.6x faster than ungrouping there;
// the GEMMs are not measured on them).
bool UseGroupGemm(const int64_t* w, const int64_t* stride, const int64_t* pad_begin,
                  const int64_t* pad_end, const int64_t* dilation, int64_t groups,
                  int64_t flags) {
  if (groups <= 1 || (flags & kBf16) || w[2] != 1 || w[3] != 1) return false;
  if (stride[0] != 1 || stride[1] != 1 || dilation[0] != 1 || dilation[1] != 1) return false;
  if (pad_begin[0] || pad_begin[1] || pad_end[0] || pad_end[1]) return false;
  if ((w[0] / groups) % 8 == 0 && w[1] % 8 == 0) return false;  // whole blocks: direct kernels
#if defined(__x86_64__)
  return !__builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

std::shared_ptr<ConvEntry> MakeGroupGemmConv(const DLTensor* src, bool residual, int64_t flags,
                                             const DLTensor* dst) {
  auto entry = std::make_shared<ConvEntry>();
  entry->group_gemm = true;
  entry->user_src = ActivationDesc(src, "conv2d data");
  entry->user_dst = ActivationDesc(dst, "conv2d output");
  entry->plain_src = memory::desc(entry->user_src.dims(), dt::f32, tag::nchw);
  entry->plain_dst = memory::desc(entry->user_dst.dims(), dt::f32, tag::nchw);
  entry->reorder_src = entry->plain_src != entry->user_src;
  entry->reorder_dst = entry->plain_dst != entry->user_dst;
  if (entry->reorder_src) entry->src_in = Reorder(entry->user_src, entry->plain_src);
  if (entry->reorder_dst) entry->dst_out = Reorder(entry->plain_dst, entry->user_dst);
  const memory::desc bias_md({1, entry->user_dst.dims()[1], 1, 1}, dt::f32, tag::nchw);
  dnnl::post_ops ops;
  if (residual) ops.append_binary(dnnl::algorithm::binary_add, entry->user_dst);
  AppendActivation(ops, flags);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  dnnl::binary::desc add_bias(dnnl::algorithm::binary_add, entry->user_dst, bias_md,
                              entry->user_dst);
  entry->epilogue = dnnl::binary(dnnl::binary::primitive_desc(add_bias, attr, Engine()));
  entry->memories.Init({entry->user_src, entry->user_dst, entry->plain_src, entry->plain_dst,
                        bias_md, entry->user_dst});
  return entry;
}

// out = act(conv1x1(data, weight, groups) + bias [+ residual]) for a MakeGroupGemmConv entry.
void GroupGemmConv(ConvEntry& entry, const DLTensor* src, const DLTensor* weight,
                   const DLTensor* bias, const DLTensor* residual, int64_t groups,
                   DLTensor* dst) {
  enum { kUserSrc, kUserDst, kPlainSrc, kPlainDst, kBias, kResidual };
  MemoryPool::Lease m = entry.memories.Take();
  const float* x = FloatData(src);
  if (entry.reorder_src) {
    float* plain = Scratch(0, entry.plain_src.get_size());
    Execute(entry.src_in, {{DNNL_ARG_FROM, m.Over(kUserSrc, x)},
                           {DNNL_ARG_TO, m.Over(kPlainSrc, plain)}});
    Stream().wait();
    x = plain;
  }
  float* y = entry.reorder_dst ? Scratch(1, entry.plain_dst.get_size()) : FloatData(dst);
  const memory::dims in = entry.plain_src.dims(), out = entry.plain_dst.dims();
  const int64_t pixels = in[2] * in[3], in_group = in[1] / groups, out_group = out[1] / groups;
  const float* w = FloatData(weight);  // [O, I / groups]: group g's rows are contiguous
  const int64_t tasks = in[0] * groups;
  // Inside the parallel loop each dnnl_sgemm runs on its calling thread.
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t n = t / groups, g = t % groups;
    dnnl_sgemm('N', 'N', out_group, pixels, in_group, 1.f, w + g * out_group * in_group,
               in_group, x + (n * in[1] + g * in_group) * pixels, pixels, 0.f,
               y + (n * out[1] + g * out_group) * pixels, pixels);
  }
  dnnl_memory_t dst_m = m.Over(kUserDst, FloatData(dst));
  if (entry.reorder_dst) {
    Execute(entry.dst_out, {{DNNL_ARG_FROM, m.Over(kPlainDst, y)}, {DNNL_ARG_TO, dst_m}});
  }
  dnnl_memory_t bias_m = m.Over(kBias, FloatData(bias));
  if (residual == nullptr) {
    Execute(entry.epilogue, {{DNNL_ARG_SRC_0, dst_m}, {DNNL_ARG_SRC_1, bias_m},
                             {DNNL_ARG_DST, dst_m}});
  } else {
    Execute(entry.epilogue, {{DNNL_ARG_SRC_0, dst_m}, {DNNL_ARG_SRC_1, bias_m},
                             {DNNL_ARG_DST, dst_m},
                             {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                              m.Over(kResidual, FloatData(residual))}});
  }
  Stream().wait();
}

std::shared_ptr<ConvEntry> MakeConv(const DLTensor* src, const DLTensor* weight, bool residual,
                                    const int64_t* stride, const int64_t* pad_begin,
                                    const int64_t* pad_end, const int64_t* dilation,
                                    int64_t groups, int64_t flags, const DLTensor* dst) {
  memory::desc user_src = ActivationDesc(src, "conv2d data");
  memory::desc user_dst = ActivationDesc(dst, "conv2d output");
  const dt input = InputType(flags);
  auto any = [](const memory::desc& md, dt type = dt::f32) {
    return memory::desc(md.dims(), type, tag::any);
  };
  memory::dims w = Dims(weight);  // O, I/groups, KH, KW
  memory::dims wdims = w;
  memory::desc user_weights(w, dt::f32, tag::oihw);
  if (groups > 1) {
    wdims = {groups, w[0] / groups, w[1], w[2], w[3]};
    user_weights = memory::desc(wdims, dt::f32, tag::goihw);
  }
  memory::desc bias_md({w[0]}, dt::f32, tag::x);
  auto make = [&](const memory::desc& src_md, const memory::desc& dst_md, bool with_residual,
                  dnnl::algorithm algorithm = dnnl::algorithm::convolution_direct) {
    dnnl::convolution_forward::desc desc(
        dnnl::prop_kind::forward_inference, algorithm, src_md,
        memory::desc(wdims, input, tag::any), bias_md, dst_md, {stride[0], stride[1]},
        {dilation[0] - 1, dilation[1] - 1}, {pad_begin[0], pad_begin[1]},
        {pad_end[0], pad_end[1]});
    dnnl::post_ops ops;
    if (with_residual && algorithm == dnnl::algorithm::convolution_winograd) {
      ops.append_sum(1.f);
    } else if (with_residual) {
      ops.append_binary(dnnl::algorithm::binary_add, dst_md);
    }
    AppendActivation(ops, flags);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    return dnnl::convolution_forward::primitive_desc(desc, attr, Engine());
  };
  // bf16: the primitive picks both layouts. Given the caller's blocked ones, oneDNN 2.6 ran its
  // AVX-512-bf16 kernels instead of the AMX ones, which take NHWC: resnet50 1.55x fp32's time,
  // against 0.61x with reorders in and out (2 cores, Sapphire Rapids).
  const bool bf16 = input == dt::bf16;
  bool plain_src = src->ndim == 4 || bf16, plain_dst = dst->ndim == 4 || bf16;
  const memory::desc src_md = plain_src ? any(user_src, input) : WithType(user_src, input);
  auto pd = make(src_md, plain_dst ? any(user_dst) : user_dst, false);
  if (IsReference(pd) && !(plain_src && plain_dst)) {
    // No optimized kernel takes these layouts (an 8-channel block on an AVX-512 machine, say):
    // let the primitive pick both and reorder.
    pd = make(any(user_src, input), any(user_dst), false);
  }
  int64_t ungroup = 1;
  if (groups > 1 && groups <= kMaxUngroup && w[1] > 1 && IsGemmOrReference(pd)) {
    // Groups that are not whole vector blocks (shufflenet's 4 groups of 68 channels) have no
    // direct kernel on AVX2 machines: oneDNN's GEMM-based one ran shufflenet 4x slower than the
    // ungrouped convolution with zero weights between groups (measured, 2 cores). AVX-512
    // machines have a direct kernel for them, 1.6x faster than ungrouping there: decided here,
    // on the machine that runs the model.
    ungroup = groups;
    wdims = {w[0], w[1] * groups, w[2], w[3]};
    user_weights = memory::desc(wdims, dt::f32, tag::oihw);
    pd = make(src_md, plain_dst ? any(user_dst) : user_dst, false);
    if (IsReference(pd) && !(plain_src && plain_dst)) {
      pd = make(any(user_src, input), any(user_dst), false);
    }
  }
  bool winograd = false;
  if (input == dt::f32 && ungroup == 1 && groups == 1 && w[2] == 3 && w[3] == 3 &&
      stride[0] == 1 && stride[1] == 1 && dilation[0] == 1 && dilation[1] == 1 &&
      w[0] >= kMinWinogradChannels && w[1] >= kMinWinogradChannels) {
    // Winograd F(2x2|4x4, 3x3): 1.1-3x faster than the direct kernel at batch 1 on AVX-512
    // (measured, 2 cores: 64 channels at 56x56 475 -> 254 us, 512 at 7x7 487 -> 300 us; 16
    // channels at 112x112 10% slower, hence the channel floor), 3e-7 relative error per layer.
    // oneDNN's own `convolution_auto` never picks it at small batches. Its weights take 1.8x
    // (2x2 tiles) or 4x (4x4) the memory. Where oneDNN has no such kernel (no AVX-512, or
    // these layouts), the direct one stays.
    try {
      auto wino = make(plain_src ? any(user_src) : pd.src_desc(),
                       plain_dst ? any(user_dst) : pd.dst_desc(), residual,
                       dnnl::algorithm::convolution_winograd);
      if (!IsReference(wino)) pd = wino, winograd = true;
    } catch (const dnnl::error&) {
    }
  }
  // The residual (a binary post-op input) needs a fixed layout: the one the primitive prefers
  // without it. It is reordered into that layout when the output is.
  if (residual && !winograd) pd = make(pd.src_desc(), pd.dst_desc(), true);

  auto entry = std::make_shared<ConvEntry>();
  entry->residual_as_sum = residual && winograd;
  entry->pd = pd;
  entry->primitive = dnnl::convolution_forward(pd);
  entry->weights.user = user_weights;
  entry->weights.packed = pd.weights_desc();
  entry->weights.ungroup = ungroup;
  entry->user_src = user_src;
  entry->user_dst = user_dst;
  entry->reorder_src = pd.src_desc() != user_src;
  entry->reorder_dst = pd.dst_desc() != user_dst;
  if (entry->reorder_src) entry->src_in = Reorder(user_src, pd.src_desc());
  if (entry->reorder_dst) {
    entry->dst_out = Reorder(pd.dst_desc(), user_dst);
    if (residual) entry->residual_in = Reorder(user_dst, pd.dst_desc());
  }
  entry->memories.Init({user_src, user_dst, pd.bias_desc(), user_dst, pd.src_desc(),
                        pd.dst_desc(), pd.dst_desc()});
  return entry;
}

void Conv2d(DLTensor* src, DLTensor* weight, DLTensor* bias, DLTensor* residual,
            const int64_t* attrs, int64_t weight_id, DLTensor* dst) {
  // attrs: stride h, w; pad top, left, bottom, right; dilation h, w; groups; flags
  CheckOperands("edgec dnnl", "conv2d", src, weight, bias, dst, residual);
  if (weight->ndim != 4) TVM_FFI_THROW(ValueError) << "edgec dnnl: conv2d weight must be OIHW";
  if (Empty(src) || Empty(dst)) return;

  // Multiply-adds: every output element reads (input channels / groups) x kh x kw weights.
  int64_t macs = weight->shape[1] * weight->shape[2] * weight->shape[3];
  for (int i = 0; i < dst->ndim; ++i) macs *= dst->shape[i];
  ThreadsScope threads(macs < kSerialConvMacs);
  std::vector<int64_t> key(attrs, attrs + 10);
  key.insert(key.end(), {residual != nullptr, threads.serial()});
  AppendShape(&key, src);
  AppendShape(&key, weight);
  AppendShape(&key, dst);
  static PrimitiveCache<ConvEntry> cache;
  auto entry = cache.Get(key, [&]() {
    if (UseGroupGemm(weight->shape, attrs, attrs + 2, attrs + 4, attrs + 6, attrs[8], attrs[9])) {
      return MakeGroupGemmConv(src, residual != nullptr, attrs[9], dst);
    }
    return MakeConv(src, weight, residual != nullptr, attrs, attrs + 2, attrs + 4, attrs + 6,
                    attrs[8], attrs[9], dst);
  });
  if (entry->group_gemm) {
    GroupGemmConv(*entry, src, weight, bias, residual, attrs[8], dst);
    return;
  }

  const auto& pd = entry->pd;
  MemoryPool::Lease m = entry->memories.Take();
  dnnl_memory_t src_m = m.Over(ConvEntry::kSrc, FloatData(src));
  dnnl_memory_t dst_m = m.Over(ConvEntry::kDst, FloatData(dst));
  dnnl_memory_t src_p = src_m, dst_p = dst_m;
  if (entry->reorder_src) {
    src_p = m.Over(ConvEntry::kSrcPacked, Scratch(0, pd.src_desc().get_size()));
    Execute(entry->src_in, {{DNNL_ARG_FROM, src_m}, {DNNL_ARG_TO, src_p}});
  }
  if (entry->reorder_dst) {
    dst_p = m.Over(ConvEntry::kDstPacked, Scratch(1, pd.dst_desc().get_size()));
  }
  const memory weights = entry->weights.Get(weight_id, FloatData(weight));
  dnnl_memory_t bias_m = m.Over(ConvEntry::kBias, FloatData(bias));
  if (residual == nullptr) {
    Execute(entry->primitive, {{DNNL_ARG_SRC, src_p}, {DNNL_ARG_WEIGHTS, weights.get()},
                               {DNNL_ARG_BIAS, bias_m}, {DNNL_ARG_DST, dst_p}});
  } else if (entry->residual_as_sum) {
    // The sum post-op adds what the output holds: the residual, in the primitive's layout.
    dnnl_memory_t residual_m = m.Over(ConvEntry::kResidual, FloatData(residual));
    if (entry->reorder_dst) {
      Execute(entry->residual_in, {{DNNL_ARG_FROM, residual_m}, {DNNL_ARG_TO, dst_p}});
    } else if (FloatData(residual) != FloatData(dst)) {
      std::memcpy(FloatData(dst), FloatData(residual), entry->user_dst.get_size());
    }
    Execute(entry->primitive, {{DNNL_ARG_SRC, src_p}, {DNNL_ARG_WEIGHTS, weights.get()},
                               {DNNL_ARG_BIAS, bias_m}, {DNNL_ARG_DST, dst_p}});
  } else {
    // The residual, a binary post-op's input, in the layout the primitive writes.
    dnnl_memory_t residual_m = m.Over(ConvEntry::kResidual, FloatData(residual));
    if (entry->reorder_dst) {
      dnnl_memory_t reordered =
          m.Over(ConvEntry::kResidualPacked, Scratch(2, pd.dst_desc().get_size()));
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

// conv2d(data, weight[O, I/groups, KH, KW], bias[O], stride h, w, pad top, left, bottom, right,
//        dilation h, w, groups, flags, weight id, out): out = act(conv(data, weight) + bias)
void Conv2dExport(DLTensor* src, DLTensor* weight, DLTensor* bias, int64_t stride_h,
                  int64_t stride_w, int64_t pad_top, int64_t pad_left, int64_t pad_bottom,
                  int64_t pad_right, int64_t dilation_h, int64_t dilation_w, int64_t groups,
                  int64_t flags, int64_t weight_id, DLTensor* dst) {
  const int64_t attrs[] = {stride_h, stride_w, pad_top, pad_left, pad_bottom,
                           pad_right, dilation_h, dilation_w, groups, flags};
  try {
    Conv2d(src, weight, bias, nullptr, attrs, weight_id, dst);
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << "edgec dnnl conv2d: " << e.what();
  }
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
  try {
    Conv2d(src, weight, bias, residual, attrs, weight_id, dst);
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << "edgec dnnl conv2d: " << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Matmul

struct MatmulEntry {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
  WeightSlot weights;
  dnnl::reorder src_in;  // bf16: the f32 input into the primitive's
  // dense: the caller's data, bias, output; bf16, the converted data. batch_matmul: a, b, output.
  enum { kSrc, kBias, kDst, kSrcConverted };
  MemoryPool memories;
};

// A dense of a few rows over a large weight (a decoder's vocabulary projection, a few tokens at a
// time) streams the weight once, 16 columns at a time, each panel's columns contiguous: Debian's
// oneDNN 2.6 took 9.7-12 ms for 2-6 rows over whisper-tiny's 384 x 51865 vocabulary (80 MB) where
// one pass over the weight takes 4.6-7 ms, and 18.7 against 10.5 ms over GPT-2's 768 x 50257
// (2 threads, Zen 3). Below about 16 MB of weight, or for one row (its matrix-vector kernel
// streams well), or past 6 rows (accumulators no longer fit the registers), oneDNN's is as fast
// or faster. The panels are a second copy of the weight, packed on first use, per weight id.
constexpr int kPanel = 16;
constexpr int64_t kPanelMinRows = 2, kPanelMaxRows = 6;
constexpr int64_t kPanelMinWeightBytes = int64_t(16) << 20;

bool UsePanels(int64_t m, int64_t k, int64_t n, int64_t flags) {
  const Act act = FusedActivationOf(flags).kind;
  return m >= kPanelMinRows && m <= kPanelMaxRows && !(flags & kBf16) &&
         (act == Act::kNone || act == Act::kRelu) &&
         k * n * int64_t(sizeof(float)) >= kPanelMinWeightBytes;
}

// weight [K, N] as panels [ceil(N / 16)][K][16], the last one zero-padded; packed once per id.
std::shared_ptr<const std::vector<float>> PanelWeights(int64_t id, const float* weight, int64_t k,
                                                       int64_t n) {
  static std::mutex mutex;
  static std::unordered_map<int64_t, std::shared_ptr<const std::vector<float>>> cache;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(id);
    if (it != cache.end()) return it->second;
  }
  const int64_t panels = (n + kPanel - 1) / kPanel;
  auto packed = std::make_shared<std::vector<float>>(panels * k * kPanel, 0.f);
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t cols = std::min<int64_t>(kPanel, n - p * kPanel);
    float* panel = packed->data() + p * k * kPanel;
    for (int64_t r = 0; r < k; ++r) {
      std::memcpy(panel + r * kPanel, weight + r * n + p * kPanel, cols * sizeof(float));
    }
  }
  std::lock_guard<std::mutex> lock(mutex);
  return cache.emplace(id, std::move(packed)).first->second;
}

struct PanelCall {
  const float* x;  // [M, K]
  const float* panels;
  const float* bias;  // [N]
  float* y;           // [M, N]
  int64_t k, n;
  bool relu;
};

// Rows x 16 accumulators in registers over K, then bias, relu and the panel's valid columns.
template <int M>
inline __attribute__((always_inline)) void DensePanel(const PanelCall& c, int64_t p) {
  const int64_t n0 = p * kPanel, cols = std::min<int64_t>(kPanel, c.n - n0);
  const float* w = c.panels + p * c.k * kPanel;
  float acc[M][kPanel] = {};
  for (int64_t r = 0; r < c.k; ++r) {
    const float* wr = w + r * kPanel;
    for (int i = 0; i < M; ++i) {
      const float xv = c.x[i * c.k + r];
      for (int j = 0; j < kPanel; ++j) acc[i][j] += xv * wr[j];
    }
  }
  for (int i = 0; i < M; ++i) {
    float* out = c.y + i * c.n + n0;
    for (int64_t j = 0; j < cols; ++j) {
      const float v = acc[i][j] + c.bias[n0 + j];
      out[j] = c.relu && v < 0.f ? 0.f : v;
    }
  }
}

using PanelFn = void (*)(const PanelCall&, int64_t);

template <int M>
void DensePanelBaseline(const PanelCall& c, int64_t p) { DensePanel<M>(c, p); }
#if defined(__x86_64__)
template <int M>
__attribute__((target("avx512f,fma"))) void DensePanelAvx512(const PanelCall& c, int64_t p) {
  DensePanel<M>(c, p);
}
template <int M>
__attribute__((target("avx2,fma"))) void DensePanelAvx2(const PanelCall& c, int64_t p) {
  DensePanel<M>(c, p);
}
#endif

// The panel kernel for `rows` (kPanelMinRows..kPanelMaxRows), for the widest vectors the CPU has.
PanelFn PanelKernel(int64_t rows) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) {
    static const PanelFn avx512[] = {DensePanelAvx512<2>, DensePanelAvx512<3>,
                                     DensePanelAvx512<4>, DensePanelAvx512<5>,
                                     DensePanelAvx512<6>};
    return avx512[rows - kPanelMinRows];
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    static const PanelFn avx2[] = {DensePanelAvx2<2>, DensePanelAvx2<3>, DensePanelAvx2<4>,
                                   DensePanelAvx2<5>, DensePanelAvx2<6>};
    return avx2[rows - kPanelMinRows];
  }
#endif
  static const PanelFn baseline[] = {DensePanelBaseline<2>, DensePanelBaseline<3>,
                                     DensePanelBaseline<4>, DensePanelBaseline<5>,
                                     DensePanelBaseline<6>};
  return baseline[rows - kPanelMinRows];
}

void DenseByPanels(const float* x, const float* weight, const float* bias, int64_t weight_id,
                   int64_t m, int64_t k, int64_t n, bool relu, float* y) {
  const std::shared_ptr<const std::vector<float>> panels = PanelWeights(weight_id, weight, k, n);
  const PanelCall call{x, panels->data(), bias, y, k, n, relu};
  const PanelFn kernel = PanelKernel(m);
  const int64_t count = (n + kPanel - 1) / kPanel;
  ThreadsScope threads(false);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < count; ++p) kernel(call, p);
}

// A bf16 dense pays where it streams a large weight (half the bytes) or multiplies a lot (AMX);
// below both, converting the input and starting the AMX kernel cost more than they save, and
// the call runs fp32, more exact than the accuracy guard assumed. 2 threads, Sapphire Rapids:
// [K, N] = 768 x 768 bf16/fp32 0.67 at 1 row; 192 x 192 1.2 up to 8 rows, 0.64 at 32; 128 x 128
// 1.2 up to 32 rows, 0.98 at 64.
constexpr int64_t kBf16MinWeight = int64_t(1) << 18, kBf16MinMacs = int64_t(1) << 20;

bool Bf16Pays(int64_t m, int64_t k, int64_t n) {
  return k * n >= kBf16MinWeight || m * k * n >= kBf16MinMacs;
}

// dense(data[..., K], weight[K, N], bias[N], flags, weight id, out[..., N]):
// out = act(data @ weight + bias), the leading dims of data flattened into M.
void Dense(DLTensor* src, DLTensor* weight, DLTensor* bias, int64_t flags, int64_t weight_id,
           DLTensor* dst) {
  CheckOperands("edgec dnnl", "dense", src, weight, bias, dst);
  if (weight->ndim != 2 || src->ndim < 1 || src->shape[src->ndim - 1] != weight->shape[0]) {
    TVM_FFI_THROW(ValueError) << "edgec dnnl: dense needs data [..., K] and weight [K, N]";
  }
  int64_t k = weight->shape[0], n = weight->shape[1];
  int64_t m = 1;
  for (int i = 0; i + 1 < src->ndim; ++i) m *= src->shape[i];
  if (m == 0 || n == 0) return;
  if ((flags & kBf16) && !Bf16Pays(m, k, n)) flags &= ~kBf16;
  if (UsePanels(m, k, n, flags)) {
    DenseByPanels(FloatData(src), FloatData(weight), FloatData(bias), weight_id, m, k, n,
                  FusedActivationOf(flags).kind == Act::kRelu, FloatData(dst));
    return;
  }

  ThreadsScope threads(m * k * n < kSerialMacs);
  static PrimitiveCache<MatmulEntry> cache;
  auto entry = cache.Get({m, k, n, flags, threads.serial()}, [&]() {
    dnnl::post_ops ops;
    AppendActivation(ops, flags);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    const dt input = InputType(flags);
    dnnl::matmul::desc desc(memory::desc({m, k}, input, tag::ab),
                            memory::desc({k, n}, input, tag::any),
                            memory::desc({1, n}, dt::f32, tag::ab),
                            memory::desc({m, n}, dt::f32, tag::ab));
    dnnl::matmul::primitive_desc pd(desc, attr, Engine());
    auto entry = std::make_shared<MatmulEntry>();
    entry->pd = pd;
    entry->primitive = dnnl::matmul(pd);
    entry->weights.user = memory::desc({k, n}, dt::f32, tag::ab);
    entry->weights.packed = pd.weights_desc();
    const memory::desc user_src({m, k}, dt::f32, tag::ab);
    if (input != dt::f32) entry->src_in = Reorder(user_src, pd.src_desc());
    entry->memories.Init({user_src, pd.bias_desc(), pd.dst_desc(), pd.src_desc()});
    return entry;
  });
  const auto& pd = entry->pd;
  MemoryPool::Lease mem = entry->memories.Take();
  dnnl_memory_t src_m = mem.Over(MatmulEntry::kSrc, FloatData(src));
  if (flags & kBf16) {
    dnnl_memory_t converted =
        mem.Over(MatmulEntry::kSrcConverted, Scratch(0, pd.src_desc().get_size()));
    Execute(entry->src_in, {{DNNL_ARG_FROM, src_m}, {DNNL_ARG_TO, converted}});
    src_m = converted;
  }
  const memory weights = entry->weights.Get(weight_id, FloatData(weight));
  Execute(entry->primitive, {{DNNL_ARG_SRC, src_m}, {DNNL_ARG_WEIGHTS, weights.get()},
                             {DNNL_ARG_BIAS, mem.Over(MatmulEntry::kBias, FloatData(bias))},
                             {DNNL_ARG_DST, mem.Over(MatmulEntry::kDst, FloatData(dst))}});
  Stream().wait();
}

void DenseExport(DLTensor* src, DLTensor* weight, DLTensor* bias, int64_t flags,
                 int64_t weight_id, DLTensor* dst) {
  try {
    Dense(src, weight, bias, flags, weight_id, dst);
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << "edgec dnnl dense: " << e.what();
  }
}

// batch_matmul(a[*batch, M, K], b[*batch, K, N], out[*batch, M, N]): out = a @ b per batch
// entry, the batch dims (the same in a and b) flattened into one. Both operands are activations:
// nothing is packed ahead (attention's scores and weighted values).
void BatchMatmul(DLTensor* a, DLTensor* b, DLTensor* dst) {
  CheckFloat32(a, "edgec dnnl", "batch_matmul a");
  CheckFloat32(b, "edgec dnnl", "batch_matmul b");
  CheckFloat32(dst, "edgec dnnl", "batch_matmul output");
  const int rank = a->ndim;
  bool same_batch = rank >= 3 && b->ndim == rank && dst->ndim == rank;
  int64_t batch = 1;
  for (int i = 0; same_batch && i + 2 < rank; ++i) {
    same_batch = a->shape[i] == b->shape[i] && a->shape[i] == dst->shape[i];
    batch *= a->shape[i];
  }
  if (!same_batch || a->shape[rank - 1] != b->shape[rank - 2]) {
    TVM_FFI_THROW(ValueError) << "edgec dnnl: batch_matmul needs a [*batch, M, K], b [*batch, K, N]";
  }
  const int64_t m = a->shape[rank - 2], k = a->shape[rank - 1], n = b->shape[rank - 1];
  if (batch == 0 || m == 0 || n == 0) return;
  ThreadsScope threads(batch * m * k * n < kSerialMacs);
  static PrimitiveCache<MatmulEntry> cache;
  auto entry = cache.Get({batch, m, k, n, threads.serial()}, [&]() {
    dnnl::matmul::desc desc(memory::desc({batch, m, k}, dt::f32, tag::abc),
                            memory::desc({batch, k, n}, dt::f32, tag::abc),
                            memory::desc({batch, m, n}, dt::f32, tag::abc));
    dnnl::matmul::primitive_desc pd(desc, Engine());
    auto entry = std::make_shared<MatmulEntry>();
    entry->pd = pd;
    entry->primitive = dnnl::matmul(pd);
    entry->memories.Init({pd.src_desc(), pd.weights_desc(), pd.dst_desc()});
    return entry;
  });
  MemoryPool::Lease mem = entry->memories.Take();
  Execute(entry->primitive, {{DNNL_ARG_SRC, mem.Over(0, FloatData(a))},
                             {DNNL_ARG_WEIGHTS, mem.Over(1, FloatData(b))},
                             {DNNL_ARG_DST, mem.Over(2, FloatData(dst))}});
  Stream().wait();
}

void BatchMatmulExport(DLTensor* a, DLTensor* b, DLTensor* dst) {
  try {
    BatchMatmul(a, b, dst);
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << "edgec dnnl batch_matmul: " << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Softmax

// Below this many elements one thread does a softmax or a layer norm: waking the second costs
// more than it saves.
constexpr int64_t kSerialElements = int64_t(1) << 14;

struct SoftmaxEntry {
  dnnl::softmax_forward::primitive_desc pd;
  dnnl::softmax_forward primitive;
  MemoryPool memories;  // input, output
};

// softmax(x[...], axis, out[...]): out = exp(x - max) / sum(exp(x - max)) along `axis`, in
// oneDNN's vectorized, threaded kernel (TVM's ran serial and scalar between library calls: a
// third of the Whisper encoder's time). The tensor is viewed as [outer, axis, inner].
void Softmax(DLTensor* src, int64_t axis, DLTensor* dst) {
  CheckFloat32(src, "edgec dnnl", "softmax input");
  CheckFloat32(dst, "edgec dnnl", "softmax output");
  const int rank = src->ndim;
  bool same = dst->ndim == rank && rank >= 1;
  for (int i = 0; same && i < rank; ++i) same = src->shape[i] == dst->shape[i];
  if (axis < 0) axis += rank;
  if (!same || axis < 0 || axis >= rank) {
    TVM_FFI_THROW(ValueError) << "edgec dnnl: softmax needs input and output of one shape and an "
                                 "axis inside it";
  }
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= src->shape[i];
  for (int i = axis + 1; i < rank; ++i) inner *= src->shape[i];
  const int64_t length = src->shape[axis];
  if (outer == 0 || inner == 0 || length == 0) return;
  ThreadsScope threads(outer * length * inner < kSerialElements);
  static PrimitiveCache<SoftmaxEntry> cache;
  auto entry = cache.Get({outer, length, inner, threads.serial()}, [&]() {
    const memory::desc md = inner == 1 ? memory::desc({outer, length}, dt::f32, tag::ab)
                                       : memory::desc({outer, length, inner}, dt::f32, tag::abc);
    dnnl::softmax_forward::desc desc(dnnl::prop_kind::forward_inference, md, 1);
    dnnl::softmax_forward::primitive_desc pd(desc, Engine());
    auto entry = std::make_shared<SoftmaxEntry>();
    entry->pd = pd;
    entry->primitive = dnnl::softmax_forward(pd);
    entry->memories.Init({md, md});
    return entry;
  });
  MemoryPool::Lease mem = entry->memories.Take();
  Execute(entry->primitive, {{DNNL_ARG_SRC, mem.Over(0, FloatData(src))},
                             {DNNL_ARG_DST, mem.Over(1, FloatData(dst))}});
  Stream().wait();
}

void SoftmaxExport(DLTensor* src, int64_t axis, DLTensor* dst) {
  try {
    Softmax(src, axis, dst);
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << "edgec dnnl softmax: " << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Layer normalization

struct LayerNormEntry {
  dnnl::layer_normalization_forward::primitive_desc pd;
  dnnl::layer_normalization_forward primitive;
  MemoryPool memories;  // input, gamma, beta, output
};

// Rows of `src` (its last `trailing` dims, flattened) normalized to mean 0 and variance 1
// (epsilon added to the variance), then scaled by gamma and shifted by beta where given.
void Normalize(DLTensor* src, DLTensor* gamma, DLTensor* beta, int64_t trailing, double epsilon,
               DLTensor* dst) {
  CheckFloat32(src, "edgec dnnl", "layer_norm input");
  CheckFloat32(dst, "edgec dnnl", "layer_norm output");
  const bool affine = gamma != nullptr;
  if (affine) {
    CheckFloat32(gamma, "edgec dnnl", "layer_norm gamma");
    CheckFloat32(beta, "edgec dnnl", "layer_norm beta");
  }
  const int rank = src->ndim;
  bool same = dst->ndim == rank && trailing >= 1 && trailing <= rank;
  for (int i = 0; same && i < rank; ++i) same = src->shape[i] == dst->shape[i];
  int64_t rows = 1, channels = 1;
  for (int i = 0; same && i < rank; ++i) (i < rank - trailing ? rows : channels) *= src->shape[i];
  if (!same || (affine && (gamma->ndim != 1 || beta->ndim != 1 ||
                           gamma->shape[0] != channels || beta->shape[0] != channels))) {
    TVM_FFI_THROW(ValueError) << "edgec dnnl: layer_norm needs x and out of one shape, gamma and "
                                 "beta [C] for its last dim C";
  }
  if (rows == 0 || channels == 0) return;
  ThreadsScope threads(rows * channels < kSerialElements);
  static PrimitiveCache<LayerNormEntry> cache;
  const float eps = static_cast<float>(epsilon);
  int64_t eps_bits = 0;
  std::memcpy(&eps_bits, &eps, sizeof(eps));
  auto entry = cache.Get({rows, channels, eps_bits, affine, threads.serial()}, [&]() {
    const auto flags = affine ? dnnl::normalization_flags::use_scale |
                                    dnnl::normalization_flags::use_shift
                              : dnnl::normalization_flags::none;
    dnnl::layer_normalization_forward::desc desc(
        dnnl::prop_kind::forward_inference, memory::desc({rows, channels}, dt::f32, tag::ab), eps,
        flags);
    dnnl::layer_normalization_forward::primitive_desc pd(desc, Engine());
    auto entry = std::make_shared<LayerNormEntry>();
    entry->pd = pd;
    entry->primitive = dnnl::layer_normalization_forward(pd);
    const memory::desc vector({channels}, dt::f32, tag::a);
    entry->memories.Init({pd.src_desc(), vector, vector, pd.dst_desc()});
    return entry;
  });
  MemoryPool::Lease mem = entry->memories.Take();
  if (affine) {
    Execute(entry->primitive, {{DNNL_ARG_SRC, mem.Over(0, FloatData(src))},
                               {DNNL_ARG_SCALE, mem.Over(1, FloatData(gamma))},
                               {DNNL_ARG_SHIFT, mem.Over(2, FloatData(beta))},
                               {DNNL_ARG_DST, mem.Over(3, FloatData(dst))}});
  } else {
    Execute(entry->primitive, {{DNNL_ARG_SRC, mem.Over(0, FloatData(src))},
                               {DNNL_ARG_DST, mem.Over(3, FloatData(dst))}});
  }
  Stream().wait();
}

// layer_norm(x[..., C], gamma[C], beta[C], epsilon, out[..., C]): each row of C normalized, then
// scaled by gamma and shifted by beta.
void LayerNormExport(DLTensor* src, DLTensor* gamma, DLTensor* beta, double epsilon,
                     DLTensor* dst) {
  try {
    Normalize(src, gamma, beta, 1, epsilon, dst);
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << "edgec dnnl layer_norm: " << e.what();
  }
}

// standardize(x, trailing, epsilon, out): x's last `trailing` dims, as one row per index of the
// others, normalized without scale or shift (instance and group norm before their affine).
void StandardizeExport(DLTensor* src, int64_t trailing, double epsilon, DLTensor* dst) {
  try {
    Normalize(src, nullptr, nullptr, trailing, epsilon, dst);
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << "edgec dnnl standardize: " << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Pooling

// Pooling is edgec's own loop, not oneDNN's: Debian's oneDNN 2.6 took 180-450 us for a 3x3 max
// pool over nChw8c tensors of googlenet and squeezenet (2 threads, AMD Zen 3) that this loop, on
// the same tensors and OpenMP threads, does in 45-100 us, and in 120-250 us on one (its jit:avx2
// kernel 380-730). Each output row (n, channel block, oh) is a task; a window's taps are clipped to
// the input, so the padding is never read: max over the taps, or their sum divided by the window
// (average including padding; the end padding follows from the output's size, so no window reaches
// past it) or by the taps it covers (excluding padding).
struct PoolRow {
  int64_t height, width, out_width;  // of the input, and of the output row
  int64_t kh, kw, sw, pl;
  int64_t kind;  // 0 max, 1 average including the padding, 2 excluding it
};

// One output row of a pool over a [.., H, W, B] plane (B channels per pixel, innermost), for a
// block size known at compile time: the window's B lanes accumulate in registers.
template <int B>
inline __attribute__((always_inline)) void PoolRowOf(const PoolRow& r, const float* in,
                                                     float* out, int64_t ih0) {
  const int64_t h0 = std::max<int64_t>(0, ih0), h1 = std::min<int64_t>(r.height, ih0 + r.kh);
  for (int64_t ow = 0; ow < r.out_width; ++ow) {
    const int64_t iw0 = ow * r.sw - r.pl;
    const int64_t w0 = std::max<int64_t>(0, iw0), w1 = std::min<int64_t>(r.width, iw0 + r.kw);
    float acc[B];
    const bool max = r.kind == 0;
    for (int i = 0; i < B; ++i) acc[i] = max ? std::numeric_limits<float>::lowest() : 0.f;
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t w = w0; w < w1; ++w) {
        const float* p = in + (h * r.width + w) * B;
        if (max) {
          for (int i = 0; i < B; ++i) acc[i] = acc[i] < p[i] ? p[i] : acc[i];
        } else {
          for (int i = 0; i < B; ++i) acc[i] += p[i];
        }
      }
    }
    if (!max) {
      const int64_t taps = r.kind == 1 ? r.kh * r.kw : (h1 - h0) * (w1 - w0);
      const float scale = 1.f / static_cast<float>(std::max<int64_t>(1, taps));
      for (int i = 0; i < B; ++i) acc[i] *= scale;
    }
    std::memcpy(out + ow * B, acc, sizeof(acc));
  }
}

// The same for any number of channels per pixel (a plain NCHW plane: 1), accumulating in `out`.
void PoolRowAnyBlock(const PoolRow& r, int64_t block, const float* in, float* out, int64_t ih0) {
  const int64_t h0 = std::max<int64_t>(0, ih0), h1 = std::min<int64_t>(r.height, ih0 + r.kh);
  for (int64_t ow = 0; ow < r.out_width; ++ow) {
    const int64_t iw0 = ow * r.sw - r.pl;
    const int64_t w0 = std::max<int64_t>(0, iw0), w1 = std::min<int64_t>(r.width, iw0 + r.kw);
    float* acc = out + ow * block;
    const bool max = r.kind == 0;
    std::fill(acc, acc + block, max ? std::numeric_limits<float>::lowest() : 0.f);
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t w = w0; w < w1; ++w) {
        const float* p = in + (h * r.width + w) * block;
        for (int64_t i = 0; i < block; ++i) acc[i] = max ? std::max(acc[i], p[i]) : acc[i] + p[i];
      }
    }
    if (!max) {
      const int64_t taps = r.kind == 1 ? r.kh * r.kw : (h1 - h0) * (w1 - w0);
      const float scale = 1.f / static_cast<float>(std::max<int64_t>(1, taps));
      for (int64_t i = 0; i < block; ++i) acc[i] *= scale;
    }
  }
}

using PoolRowFn = void (*)(const PoolRow&, const float*, float*, int64_t);

// The row loop for oneDNN's blocks (8 channels on AVX2, 16 on AVX-512), compiled for the widest
// vectors the running CPU has: the shim itself is compiled for the baseline ISA, where these
// loops would take SSE's 4 lanes.
#if defined(__x86_64__)
__attribute__((target("avx512f"))) void PoolRow16Avx512(const PoolRow& r, const float* in,
                                                        float* out, int64_t ih0) {
  PoolRowOf<16>(r, in, out, ih0);
}
__attribute__((target("avx2"))) void PoolRow16Avx2(const PoolRow& r, const float* in, float* out,
                                                   int64_t ih0) {
  PoolRowOf<16>(r, in, out, ih0);
}
__attribute__((target("avx2"))) void PoolRow8Avx2(const PoolRow& r, const float* in, float* out,
                                                  int64_t ih0) {
  PoolRowOf<8>(r, in, out, ih0);
}
#endif
void PoolRow16(const PoolRow& r, const float* in, float* out, int64_t ih0) {
  PoolRowOf<16>(r, in, out, ih0);
}
void PoolRow8(const PoolRow& r, const float* in, float* out, int64_t ih0) {
  PoolRowOf<8>(r, in, out, ih0);
}

PoolRowFn PoolRowFor(int64_t block) {
#if defined(__x86_64__)
  if (block == 16 && __builtin_cpu_supports("avx512f")) return PoolRow16Avx512;
  if (block == 16 && __builtin_cpu_supports("avx2")) return PoolRow16Avx2;
  if (block == 8 && __builtin_cpu_supports("avx2")) return PoolRow8Avx2;
#endif
  if (block == 16) return PoolRow16;
  if (block == 8) return PoolRow8;
  return nullptr;
}

// pool2d(x, kind, kh, kw, sh, sw, pt, pl, out): max (kind 0) or average including (1) or
// excluding (2) the padding, over kh x kw windows; x and out NCHW or blocked alike. The end
// padding follows from the output's size (ceil mode makes it larger), at least 0: no window
// reaches past it, so a larger one the model declared changes nothing. kh = kw = 0: one window
// of the whole input (a global pool, also where its size is known only at run time).
void Pool2d(DLTensor* src, int64_t kind, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
            int64_t pt, int64_t pl, DLTensor* dst) {
  CheckFloat32(src, "edgec dnnl", "pool2d input");
  CheckFloat32(dst, "edgec dnnl", "pool2d output");
  const int64_t block = src->ndim == 5 ? src->shape[4] : 1;
  if ((src->ndim != 4 && src->ndim != 5) || dst->ndim != src->ndim ||
      src->shape[0] != dst->shape[0] || src->shape[1] != dst->shape[1] ||
      (src->ndim == 5 && dst->shape[4] != block) || kind < 0 || kind > 2 || sh < 1 || sw < 1) {
    TVM_FFI_THROW(ValueError) << "edgec dnnl: pool2d needs input and output of one layout, "
                                 "batch and channel count";
  }
  const int64_t height = src->shape[2], width = src->shape[3];
  const int64_t out_height = dst->shape[2], out_width = dst->shape[3];
  if (kh == 0 && kw == 0) kh = height, kw = width;
  const int64_t planes = src->shape[0] * src->shape[1];  // (n, channel block) pairs
  if (planes * out_height * out_width * block == 0) return;
  const PoolRow row{height, width, out_width, kh, kw, sw, pl, kind};
  const PoolRowFn row_fn = PoolRowFor(block);
  const float* in = FloatData(src);
  float* out = FloatData(dst);
  const int64_t rows = planes * out_height;
  ThreadsScope threads(rows * out_width * block * kh * kw < kSerialElements);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t plane = i / out_height, oh = i % out_height;
    const float* plane_in = in + plane * height * width * block;
    float* row_out = out + i * out_width * block;
    if (row_fn) {
      row_fn(row, plane_in, row_out, oh * sh - pt);
    } else {
      PoolRowAnyBlock(row, block, plane_in, row_out, oh * sh - pt);
    }
  }
}

void Pool2dExport(DLTensor* src, int64_t kind, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                  int64_t pt, int64_t pl, DLTensor* dst) {
  try {
    Pool2d(src, kind, kh, kw, sh, sw, pt, pl, dst);
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << "edgec dnnl pool2d: " << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Resize

struct ResizeEntry {
  dnnl::resampling_forward::primitive_desc pd;
  dnnl::resampling_forward primitive;
  MemoryPool memories;  // input, output
};

// resize2d(x, kind, out): out's spatial size from x's, nearest (kind 0: asymmetric coordinates,
// rounded down; the caller passes whole upscaling factors only, where oneDNN's rounding agrees)
// or bilinear (kind 1: half-pixel coordinates, borders clamped); x and out NCHW or blocked alike.
void Resize2d(DLTensor* src, int64_t kind, DLTensor* dst) {
  CheckFloat32(src, "edgec dnnl", "resize2d input");
  CheckFloat32(dst, "edgec dnnl", "resize2d output");
  const memory::desc src_md = ActivationDesc(src, "resize2d input");
  const memory::desc dst_md = ActivationDesc(dst, "resize2d output");
  const memory::dims in = src_md.dims(), out = dst_md.dims();
  const int64_t block = src->ndim == 5 ? src->shape[4] : 0;
  if (in[0] != out[0] || in[1] != out[1] || dst->ndim != src->ndim ||
      (block && dst->shape[4] != block) || kind < 0 || kind > 1) {
    TVM_FFI_THROW(ValueError) << "edgec dnnl: resize2d needs input and output of one layout, "
                                 "batch and channel count";
  }
  if (out[0] * out[1] * out[2] * out[3] == 0) return;
  if (in[2] * in[3] == 0) TVM_FFI_THROW(ValueError) << "edgec dnnl: resize2d of an empty image";
  ThreadsScope threads(out[0] * out[1] * out[2] * out[3] < kSerialElements);
  static PrimitiveCache<ResizeEntry> cache;
  auto entry = cache.Get({in[0], in[1], in[2], in[3], out[2], out[3], src->ndim, block, kind,
                          threads.serial()},
                         [&]() {
    dnnl::resampling_forward::desc desc(
        dnnl::prop_kind::forward_inference,
        kind == 0 ? dnnl::algorithm::resampling_nearest : dnnl::algorithm::resampling_linear,
        src_md, dst_md);
    dnnl::resampling_forward::primitive_desc pd(desc, Engine());
    auto entry = std::make_shared<ResizeEntry>();
    entry->pd = pd;
    entry->primitive = dnnl::resampling_forward(pd);
    entry->memories.Init({src_md, dst_md});
    return entry;
  });
  MemoryPool::Lease mem = entry->memories.Take();
  Execute(entry->primitive, {{DNNL_ARG_SRC, mem.Over(0, FloatData(src))},
                             {DNNL_ARG_DST, mem.Over(1, FloatData(dst))}});
  Stream().wait();
}

void Resize2dExport(DLTensor* src, int64_t kind, DLTensor* dst) {
  try {
    Resize2d(src, kind, dst);
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << "edgec dnnl resize2d: " << e.what();
  }
}

}  // namespace

#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_dnnl_conv2d)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_dnnl_conv2d, Conv2dExport);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_dnnl_conv2d_add)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_dnnl_conv2d_add, Conv2dAddExport);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_dnnl_dense)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_dnnl_dense, DenseExport);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_dnnl_batch_matmul)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_dnnl_batch_matmul, BatchMatmulExport);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_dnnl_softmax)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_dnnl_softmax, SoftmaxExport);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_dnnl_layer_norm)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_dnnl_layer_norm, LayerNormExport);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_dnnl_standardize)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_dnnl_standardize, StandardizeExport);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_dnnl_pool2d)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_dnnl_pool2d, Pool2dExport);
#endif
#if !defined(EDGEC_ONLY_LISTED) || defined(EDGEC_EXPORT_edgec_dnnl_resize2d)
TVM_FFI_DLL_EXPORT_TYPED_FUNC(edgec_dnnl_resize2d, Resize2dExport);
#endif
