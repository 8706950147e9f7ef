// What edgec's oneDNN shims share (dnnl_shim.cc: fp32, dnnl_int8.cc: int8): the engine and
// stream, reorders, and which primitives are small enough to run on the calling thread; the
// cache of primitives keyed by shape is shim_common.h's, shared with the XNNPACK shim. Its
// definitions are in an anonymous namespace, so each keeps its own engine and caches.
#pragma once

#include <dlpack/dlpack.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <utility>
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

// The activation the call's flags name (shim_common.h's FusedActivationOf) as an eltwise post-op.
void AppendActivation(dnnl::post_ops& ops, int64_t flags) {
  using alg = dnnl::algorithm;
  const FusedActivation a = FusedActivationOf(flags);
  switch (a.kind) {
    case Act::kNone: return;
    case Act::kRelu: ops.append_eltwise(1.f, alg::eltwise_relu, 0.f, 0.f); return;
    case Act::kClip: ops.append_eltwise(1.f, alg::eltwise_clip, 0.f, a.upper); return;
    case Act::kSigmoid: ops.append_eltwise(1.f, alg::eltwise_logistic, 0.f, 0.f); return;
    case Act::kTanh: ops.append_eltwise(1.f, alg::eltwise_tanh, 0.f, 0.f); return;
    case Act::kSwish: ops.append_eltwise(1.f, alg::eltwise_swish, 1.f, 0.f); return;
    case Act::kHardSwish: ops.append_eltwise(1.f, alg::eltwise_hardswish, 0.f, 0.f); return;
    case Act::kGeluErf: ops.append_eltwise(1.f, alg::eltwise_gelu_erf, 0.f, 0.f); return;
    case Act::kGeluTanh: ops.append_eltwise(1.f, alg::eltwise_gelu_tanh, 0.f, 0.f); return;
  }
}

dnnl::reorder Reorder(const memory::desc& from, const memory::desc& to) {
  return dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), from, Engine(), to));
}

// `primitive` run on the current thread's stream with `args` ({argument id, memory.get()}),
// through oneDNN's C API: the C++ overload takes a std::unordered_map, built per call.
void Execute(const dnnl::primitive& primitive, std::initializer_list<dnnl_exec_arg_t> args) {
  dnnl::error::wrap_c_api(
      dnnl_primitive_execute(primitive.get(), Stream().get(), static_cast<int>(args.size()),
                             args.begin()),
      "could not execute a primitive");
}

// A cached primitive's memory objects (one per desc given to Init), re-pointed at each call's
// tensors (set_data_handle, 5 ns) rather than created per call: dnnl_memory_create allocates
// (0.14 us in a loop, more in a model's fragmented heap), and prompt_encoder, 13 ops in 13 us a
// call, spent a fifth of it creating and destroying them. Each call in flight leases a set of
// its own (several threads or VMs may run one primitive at once) and gives it back at its end.
class MemoryPool {
 public:
  using Set = std::vector<memory>;

  class Lease {
   public:
    Lease(MemoryPool* pool, std::unique_ptr<Set> set) : pool_(pool), set_(std::move(set)) {}
    Lease(Lease&&) = default;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() {
      if (set_) pool_->Give(std::move(set_));
    }
    // The pool's `index`th memory object, over `data`; its handle for Execute.
    dnnl_memory_t Over(size_t index, const void* data) {
      memory& m = (*set_)[index];
      m.set_data_handle(const_cast<void*>(data));
      return m.get();
    }

   private:
    MemoryPool* pool_;
    std::unique_ptr<Set> set_;
  };

  void Init(std::vector<memory::desc> descs) { descs_ = std::move(descs); }

  Lease Take() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        std::unique_ptr<Set> set = std::move(free_.back());
        free_.pop_back();
        return Lease(this, std::move(set));
      }
    }
    auto set = std::make_unique<Set>();  // each without a buffer (DNNL_MEMORY_NONE) until Over
    for (const memory::desc& md : descs_) set->emplace_back(md, Engine(), nullptr);
    return Lease(this, std::move(set));
  }

 private:
  void Give(std::unique_ptr<Set> set) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(std::move(set));
  }

  std::vector<memory::desc> descs_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Set>> free_;
};

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
// The same for convolutions. Their kernels run near peak even on small images (a 32->32 3x3
// conv on 3 x 8 x 8 in 14 us on one core), so their threads pay off sooner: 2^21 left the
// mid-size depthwise and 1x1 convs of mobile CNNs on one thread; 2^17-2^19 took timm's ghostnet
// from 4.5-5.1 to 3.7-4.0 ms and mobilenet_v3_small from 0.74-0.98 to 0.63-0.67 ms (2 cores,
// interleaved; the three alike within noise).
constexpr int64_t kSerialConvMacs = int64_t(1) << 18;

// Whether OpenMP's threads can be counted on now. A parallel oneDNN call ends at a barrier that
// waits for every OpenMP thread; when other processes hold the cores, a descheduled partner keeps
// the caller waiting for a scheduler time slice (a few ms) per call: beside 2 CPU-bound processes
// on 2 cores, hf_hubert's oneDNN calls made it 5-32x onnxruntime's time, 1.1-1.3x with one
// thread. A parallel call stalls when its caller spent more than kStallNs, and more than half the
// call, off its CPU (libgomp sleeps after GOMP_SPINCOUNT spins, which edgec's runtime keeps
// short). A stall makes the next calls run on one thread, for a hold that doubles with each
// stalled call, up to kMaxHoldNs, and halves with each clean one (the first parallel call after a
// hold is the probe), but only while the caller's time off its CPU is also above kBusyShare of
// the parallel calls' wall time of the last ~kHalfLifeNs (sums that halve every kHalfLifeNs):
// partners kept off their cores by busy processes put it near or above a half, while the quiet
// cores of a virtual machine lose 0.2-1 ms now and then to its host, a few percent of a model's
// calls. Holding on every such stall, tv_mobilenet_v2 alone at 2 threads on a quiet VM held 4-7
// times in 105 calls (each hold 20 ms or more on one thread); it holds none now, and beside 2
// CPU-bound processes it still does.
// The recurrent loop in runtime_kernels.cc detects its stalls at its own per-step barrier.
class Contention {
 public:
  static Contention& Get() {
    static Contention contention;
    return contention;
  }

  bool Serial() const { return MonotonicNs() < serial_until_.load(std::memory_order_relaxed); }

  // After a parallel call: its wall time and its calling thread's CPU time, in ns.
  void Observe(int64_t wall_ns, int64_t cpu_ns) {
    const int64_t off_cpu = std::max<int64_t>(wall_ns - cpu_ns, 0);
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t now = MonotonicNs();  // under the lock: never before another call's last_ns_
    const double decay = std::exp2(-static_cast<double>(now - last_ns_) / kHalfLifeNs);
    last_ns_ = now;
    wall_sum_ = wall_sum_ * decay + static_cast<double>(wall_ns);
    off_sum_ = off_sum_ * decay + static_cast<double>(off_cpu);
    if (off_cpu > kStallNs && off_cpu > cpu_ns && off_sum_ > kBusyShare * wall_sum_) {
      hold_ = std::min(hold_ * 2, kMaxHoldNs);
      serial_until_.store(now + hold_, std::memory_order_relaxed);
    } else {
      hold_ = std::max(hold_ / 2, kMinHoldNs / 2);
    }
  }

  static int64_t MonotonicNs() { return Clock(CLOCK_MONOTONIC); }
  static int64_t ThreadCpuNs() { return Clock(CLOCK_THREAD_CPUTIME_ID); }

 private:
  static constexpr int64_t kStallNs = 200 * 1000;
  static constexpr int64_t kMinHoldNs = 20 * 1000 * 1000;
  static constexpr int64_t kMaxHoldNs = 2000 * 1000 * 1000;
  static constexpr double kHalfLifeNs = 50e6;
  static constexpr double kBusyShare = 0.25;

  static int64_t Clock(clockid_t clock) {
    timespec t;
    clock_gettime(clock, &t);
    return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec;
  }

  std::atomic<int64_t> serial_until_{0};
  std::mutex mutex_;  // over the sums and the hold, updated once per parallel call
  int64_t hold_ = kMinHoldNs / 2;
  int64_t last_ns_ = 0;
  double wall_sum_ = 0.0, off_sum_ = 0.0;
};

// How one oneDNN call runs, for its lifetime: on the calling thread only when `small` (its work
// does not pay for waking OpenMP's threads) or while Contention holds; else on OpenMP's threads,
// timed for Contention. A primitive is created and executed alike, so that its work split matches
// the threads that run it: `serial()` belongs in its cache key.
class ThreadsScope {
 public:
  explicit ThreadsScope(bool small)
      : serial_(small || Contention::Get().Serial()),
        saved_(serial_ ? omp_get_max_threads() : 0),
        wall_start_(serial_ ? 0 : Contention::MonotonicNs()),
        cpu_start_(serial_ ? 0 : Contention::ThreadCpuNs()) {
    if (saved_ > 1) omp_set_num_threads(1);
  }
  ~ThreadsScope() {
    if (saved_ > 1) omp_set_num_threads(saved_);
    if (!serial_) {
      Contention::Get().Observe(Contention::MonotonicNs() - wall_start_,
                                Contention::ThreadCpuNs() - cpu_start_);
    }
  }
  bool serial() const { return serial_; }
  ThreadsScope(const ThreadsScope&) = delete;
  ThreadsScope& operator=(const ThreadsScope&) = delete;

 private:
  bool serial_;
  int saved_;
  int64_t wall_start_, cpu_start_;
};

}  // namespace
