// Calls the XNNPACK shim (edgec/native/xnnpack_shim.cc) on inputs that end exactly where an
// unreadable page begins: XNNPACK reads up to XNN_EXTRA_BYTES past an input, so the shim must
// copy such inputs first or the process faults. Checks the results against plain loops; prints
// the largest error and exits non-zero above 1e-4. Built and run under qemu by
// tests/test_qemu_arm.py.

#include <dlpack/dlpack.h>
#include <sys/mman.h>
#include <tvm/ffi/c_api.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

extern "C" int __tvm_ffi_edgec_xnn_dense(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);
extern "C" int __tvm_ffi_edgec_xnn_conv2d(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);

namespace {

DLTensor Tensor(float* data, std::vector<int64_t>* shape) {
  DLTensor t{};
  t.data = data;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = static_cast<int32_t>(shape->size());
  t.dtype = DLDataType{kDLFloat, 32, 1};
  t.shape = shape->data();
  return t;
}

// Room for `floats` floats that end exactly at the start of a PROT_NONE page.
float* AtPageEnd(size_t floats) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = floats * sizeof(float), pages = (bytes + page - 1) / page;
  char* base = static_cast<char*>(mmap(nullptr, (pages + 1) * page, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (base == MAP_FAILED || mprotect(base + pages * page, page, PROT_NONE) != 0) return nullptr;
  return reinterpret_cast<float*>(base + pages * page - bytes);
}

float Value(int64_t i) { return std::sin(0.37f * static_cast<float>(i)); }

// An argument as TVM's calling convention passes it: a tensor pointer or an integer.
TVMFFIAny Arg(DLTensor* t) {
  TVMFFIAny a{};
  a.type_index = kTVMFFIDLTensorPtr;
  a.v_ptr = t;
  return a;
}

TVMFFIAny Arg(int64_t v) {
  TVMFFIAny a{};
  a.type_index = kTVMFFIInt;
  a.v_int64 = v;
  return a;
}

using SafeCall = int (*)(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);

bool Call(SafeCall f, const std::vector<TVMFFIAny>& args) {
  TVMFFIAny result{};
  result.type_index = kTVMFFINone;
  return f(nullptr, args.data(), static_cast<int32_t>(args.size()), &result) == 0;
}

}  // namespace

int main() {
  double worst = 0;

  // dense: y[m, n] = x[m, k] @ w[k, n] + b, x at the end of its page.
  const int64_t m = 5, k = 3, n = 7;
  float* x = AtPageEnd(m * k);
  if (x == nullptr) return 2;
  std::vector<float> w(k * n), b(n), y(m * n);
  for (int64_t i = 0; i < m * k; ++i) x[i] = Value(i);
  for (int64_t i = 0; i < k * n; ++i) w[i] = Value(100 + i);
  for (int64_t i = 0; i < n; ++i) b[i] = Value(200 + i);
  std::vector<int64_t> xs{m, k}, ws{k, n}, bs{n}, ys{m, n};
  DLTensor tx = Tensor(x, &xs), tw = Tensor(w.data(), &ws), tb = Tensor(b.data(), &bs),
           ty = Tensor(y.data(), &ys);
  if (!Call(__tvm_ffi_edgec_xnn_dense,
            {Arg(&tx), Arg(&tw), Arg(&tb), Arg(int64_t(0)), Arg(int64_t(1)), Arg(&ty)})) {
    std::printf("dense failed\n");
    return 3;
  }
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      float want = b[c];
      for (int64_t i = 0; i < k; ++i) want += x[r * k + i] * w[i * n + c];
      worst = std::max(worst, static_cast<double>(std::fabs(want - y[r * n + c])));
    }
  }

  // conv2d 3x3, pad 1, dense (groups 1) and depthwise (groups = channels, whose kernels load
  // whole vectors of channels): input NHWC [1, 1, 5, 5, 3] at the end of its page.
  const int64_t h = 5, wd = 5, ci = 3;
  float* in = AtPageEnd(h * wd * ci);
  if (in == nullptr) return 2;
  for (int64_t i = 0; i < h * wd * ci; ++i) in[i] = Value(300 + i);
  for (int64_t groups : {int64_t(1), ci}) {
    const int64_t co = groups == 1 ? 4 : ci, gi = ci / groups, go = co / groups;
    std::vector<float> kw(co * gi * 9), kb(co), out(h * wd * co);
    for (int64_t i = 0; i < co * gi * 9; ++i) kw[i] = Value(400 + i);
    for (int64_t i = 0; i < co; ++i) kb[i] = Value(500 + i);
    std::vector<int64_t> is{1, 1, h, wd, ci}, kws{co, gi, 3, 3}, kbs{co}, os{1, 1, h, wd, co};
    DLTensor ti = Tensor(in, &is), tk = Tensor(kw.data(), &kws), tkb = Tensor(kb.data(), &kbs),
             to = Tensor(out.data(), &os);
    std::vector<TVMFFIAny> args = {Arg(&ti), Arg(&tk), Arg(&tkb)};
    // strides, pads (top, left, bottom, right), dilations, groups, flags, weight id
    for (int64_t v : {int64_t(1), int64_t(1), int64_t(1), int64_t(1), int64_t(1), int64_t(1),
                      int64_t(1), int64_t(1), groups, int64_t(0), 2 + groups}) {
      args.push_back(Arg(v));
    }
    args.push_back(Arg(&to));
    if (!Call(__tvm_ffi_edgec_xnn_conv2d, args)) {
      std::printf("conv2d failed\n");
      return 3;
    }
    for (int64_t p = 0; p < h; ++p) {
      for (int64_t q = 0; q < wd; ++q) {
        for (int64_t o = 0; o < co; ++o) {
          float want = kb[o];
          for (int64_t c = 0; c < gi; ++c) {
            for (int64_t u = 0; u < 3; ++u) {
              for (int64_t v = 0; v < 3; ++v) {
                const int64_t pi = p + u - 1, qi = q + v - 1;
                if (pi < 0 || pi >= h || qi < 0 || qi >= wd) continue;
                want += in[(pi * wd + qi) * ci + (o / go) * gi + c] *
                        kw[((o * gi + c) * 3 + u) * 3 + v];
              }
            }
          }
          worst = std::max(worst,
                           static_cast<double>(std::fabs(want - out[(p * wd + q) * co + o])));
        }
      }
    }
  }
  std::printf("max abs error %g\n", worst);
  return worst <= 1e-4 ? 0 : 1;
}
