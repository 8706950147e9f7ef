// What edgec's oneDNN shims share (dnnl_shim.cc: fp32, dnnl_int8.cc: int8): the engine and
// stream, reorders, and which primitives are small enough to run on the calling thread; the
// cache of primitives keyed by shape is shim_common.h's, shared with the XNNPACK shim. Its
// definitions are in an anonymous namespace, so each keeps its own engine and caches.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "shim_common.h"

namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& Stream() {
  thread_local dnnl::stream stream(Engine());
  return stream;
}

dnnl::reorder Reorder(const memory::desc& from, const memory::desc& to) {
  return dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), from, Engine(), to));
}

// A conv2d_add's residual as its binary post-op's input: the caller's tensor (in the output's
// layout `user_dst`), or, when the primitive writes another layout `dst` (`into` reorders to it),
// its copy in `scratch`.
memory ResidualInput(const memory::desc& user_dst, float* data, const dnnl::reorder* into,
                     const memory::desc& dst, void* scratch) {
  memory given(user_dst, Engine(), data);
  if (into == nullptr) return given;
  memory reordered(dst, Engine(), scratch);
  into->execute(Stream(), given, reordered);
  return reordered;
}

// oneDNN's OpenMP runtime (libgomp, which libdnnl links): declared here rather than through
// <omp.h> so that the shim compiles without -fopenmp.
extern "C" int omp_get_max_threads(void);
extern "C" void omp_set_num_threads(int);

// Below this many multiply-adds a matmul is built and run on the calling thread only: waking
// OpenMP's sleeping threads (OMP_WAIT_POLICY=PASSIVE) for each small one cost more than the
// second core saved. 2^18 served the zoo's transformer at 16 tokens (0.24-0.29 -> 0.18-0.21 ms)
// but not at 32-80 tokens (32x64x128 to 80x128x64), whose matmuls then woke the pool every call:
// 2^21 took 64 tokens from 0.35 to 0.28 ms and 80 from 0.44 to 0.37 ms, as fast as spinning
// threads (OMP_WAIT_POLICY=ACTIVE) in the same run.
constexpr int64_t kSerialMacs = int64_t(1) << 21;
// The same for convolutions, whose kernels do more per multiply-add: below this, waking the
// sleeping OpenMP threads costs more than the second core saves.
constexpr int64_t kSerialConvMacs = int64_t(1) << 21;

// Holds OpenMP to one thread for its lifetime when `serial` (small matmuls and convolutions):
// created and executed alike, so their work split matches the threads that run it.
class SerialScope {
 public:
  explicit SerialScope(bool serial) : saved_(serial ? omp_get_max_threads() : 0) {
    if (saved_ > 1) omp_set_num_threads(1);
  }
  ~SerialScope() {
    if (saved_ > 1) omp_set_num_threads(saved_);
  }
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  int saved_;
};

}  // namespace
