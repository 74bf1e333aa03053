// cuda_emulator.h: run unmodified CUDA kernels on the CPU, one std::thread per CUDA thread.
//
// Include this header, then the .cu file, in a C++20 translation unit (see emulator_driver.cpp).
// It supplies what the kernels use from CUDA:
//   - threadIdx / blockIdx / blockDim / gridDim: thread_local, set by the launcher;
//   - __global__ / __device__ / __forceinline__ / __launch_bounds__: erased;
//   - __shared__: `static`, which is shared by every thread. Correct because blocks run one after
//     another and only one launch runs at a time (a process-wide mutex);
//   - __syncthreads(): a Barrier per block;
//   - __shfl_xor_sync / __shfl_down_sync: a Barrier per warp plus 32 exchange slots;
//   - __uint_as_float / __float_as_uint, and the math functions through <cmath>.
//
// Why real threads rather than running the block's threads one at a time in a loop: a kernel
// that forgets a __syncthreads() reads shared memory before another thread wrote it. With real
// threads that race happens here as it does on a GPU, and the tests see wrong sums; a sequential
// loop would hide it. The price is speed: a barrier costs a few microseconds per thread on a
// 2-core machine, so emulate small tensors (the tests stay under ~200k elements).
//
// Two costs that are not the point are kept low (measured on the 2-core CI VM, a 256-thread block):
//   - creating the threads: ~100 us of CPU per thread, i.e. 25 ms per launch, more than the
//     kernels' own work. The threads live in a process-wide team and are reused by every launch
//     (ThreadTeam below); each launch still starts from fresh thread_local state.
//   - waiting: std::barrier (libstdc++'s std::atomic::wait) spins with sched_yield before it
//     sleeps; with 8x more threads than cores, those yields were 3/4 of the system calls. Barrier
//     below sleeps in the kernel at once (a futex on Linux).
//
// Free-running threads still finish in a rather stable order, which hides races whose window
// is short (a warp overwriting shared memory another warp has not read yet). So after every
// __syncthreads() some warps, picked by a hash of (block, warp, barrier count), pause for up to
// a millisecond: over a launch, every warp is sometimes first and sometimes last.
//
// Not emulated: atomics, warp-synchronous code without __*_sync, partial-warp masks, dynamic
// shared memory, grids or blocks with y/z > 1. A kernel that calls __syncthreads() in divergent
// code is undefined behaviour on a GPU; here it deadlocks.
#pragma once

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include <unistd.h>  // getpid: a forked child starts its own thread team

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

struct dim3 {
    unsigned int x = 1;
    unsigned int y = 1;
    unsigned int z = 1;
};

inline thread_local dim3 threadIdx;
inline thread_local dim3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

using std::isfinite;

inline float __uint_as_float(unsigned int bits) { return std::bit_cast<float>(bits); }
inline unsigned int __float_as_uint(float value) { return std::bit_cast<unsigned int>(value); }

namespace cuda_emulator {

constexpr unsigned int kWarpSize = 32;
constexpr unsigned int kFullMask = 0xffffffffu;
constexpr unsigned int kMaxThreadsPerBlock = 1024;

// Sleep until `word` may no longer hold `expected` (returns at once if it already does not; may
// return spuriously, so callers loop), and wake every thread sleeping on `word`.
inline void wait_while_equal(std::atomic<std::uint32_t>& word, std::uint32_t expected)
{
#if defined(__linux__)
    // No spinning first: with many more threads than cores, the thread we wait for needs our core.
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected,
            nullptr, nullptr, 0);
#else
    word.wait(expected, std::memory_order_acquire);
#endif
}

inline void wake_all(std::atomic<std::uint32_t>& word)
{
#if defined(__linux__)
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 0x7fffffff,
            nullptr, nullptr, 0);
#else
    word.notify_all();
#endif
}

// A reusable barrier for `count` threads (what std::barrier<> gives, minus its spinning): the last
// thread to arrive resets the count, starts the next phase and wakes the others.
class Barrier {
public:
    explicit Barrier(unsigned int count) : count_(count) {}

    void arrive_and_wait()
    {
        // Read before arriving: the phase cannot end until this thread has arrived.
        const std::uint32_t phase = phase_.load(std::memory_order_acquire);
        if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == count_) {
            arrived_.store(0, std::memory_order_relaxed);  // published by the phase's release
            phase_.store(phase + 1, std::memory_order_release);
            wake_all(phase_);
            return;
        }
        while (phase_.load(std::memory_order_acquire) == phase) wait_while_equal(phase_, phase);
    }

private:
    const unsigned int count_;
    std::atomic<unsigned int> arrived_{0};
    std::atomic<std::uint32_t> phase_{0};
};

struct Warp {
    Barrier barrier{kWarpSize};
    // Two sets of slots, used alternately by successive shuffles. A lane writes set k % 2 at
    // shuffle k only after passing shuffle k-1's barrier, which every lane reaches only after it
    // has read its value of shuffle k-2 from the same set: one barrier per shuffle suffices.
    std::uint64_t slots[2][kWarpSize] = {};
};

struct Block {
    explicit Block(unsigned int threads)
        : barrier(threads), warps(std::make_unique<Warp[]>(threads / kWarpSize))
    {
    }
    Barrier barrier;
    std::unique_ptr<Warp[]> warps;
};

inline thread_local Block* current_block = nullptr;
inline thread_local unsigned int shuffle_count = 0;
inline thread_local unsigned int barrier_count = 0;

// After a quarter of the block barriers, pause the calling thread's warp for 0.1..1 ms: long
// enough for the other warps to run through a small chunk and its shuffles (~2 us per thread
// switch). Every lane of a warp computes the same hash, so a warp pauses as one.
inline void jitter_after_barrier()
{
    std::uint32_t h = blockIdx.x * 0x9e3779b1u ^ (threadIdx.x / kWarpSize) * 0x85ebca77u ^
                      barrier_count++ * 0xc2b2ae3du;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    if ((h & 3u) == 0) std::this_thread::sleep_for(std::chrono::microseconds(100 + (h >> 2) % 900));
}

// The first error a kernel thread reported during the current launch ("" when none).
inline std::mutex error_mutex;
inline std::string launch_error;

inline void report_error(const std::string& message)
{
    std::lock_guard<std::mutex> lock(error_mutex);
    if (launch_error.empty()) launch_error = message;
}

template <typename T>
T exchange(unsigned int mask, T value, unsigned int source_lane, int width, const char* name)
{
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(std::uint64_t),
                  "shuffles move values of at most 8 bytes");
    if (mask != kFullMask || width != static_cast<int>(kWarpSize)) {
        char message[160];
        std::snprintf(message, sizeof message,
                      "%s: only full-warp shuffles are emulated (mask 0xffffffff, width 32), "
                      "was mask 0x%08x, width %d",
                      name, mask, width);
        report_error(message);
    }
    Warp& warp = current_block->warps[threadIdx.x / kWarpSize];
    const unsigned int lane = threadIdx.x % kWarpSize;
    std::uint64_t* slots = warp.slots[shuffle_count++ % 2];
    std::memcpy(&slots[lane], &value, sizeof(T));
    warp.barrier.arrive_and_wait();
    T result;
    std::memcpy(&result, &slots[source_lane % kWarpSize], sizeof(T));
    return result;
}

}  // namespace cuda_emulator

inline void __syncthreads()
{
    cuda_emulator::current_block->barrier.arrive_and_wait();
    cuda_emulator::jitter_after_barrier();
}

template <typename T>
T __shfl_xor_sync(unsigned int mask, T value, int lane_mask, int width = 32)
{
    const unsigned int lane = threadIdx.x % cuda_emulator::kWarpSize;
    return cuda_emulator::exchange(mask, value, lane ^ static_cast<unsigned int>(lane_mask), width,
                                   "__shfl_xor_sync");
}

template <typename T>
T __shfl_down_sync(unsigned int mask, T value, unsigned int delta, int width = 32)
{
    const unsigned int lane = threadIdx.x % cuda_emulator::kWarpSize;
    const unsigned int source = lane + delta < cuda_emulator::kWarpSize ? lane + delta : lane;
    return cuda_emulator::exchange(mask, value, source, width, "__shfl_down_sync");
}

namespace cuda_emulator {

// The threads that run the blocks' CUDA threads, created once per process and reused by every
// launch (creating 256 threads cost more CPU than the launch's work). Worker t runs CUDA thread t
// of each launch whose block has more than t threads; a launch's threads still all exist at once
// and run concurrently, so a missing __syncthreads() races exactly as it did with threads
// created per launch. The team only grows (to the largest block launched, at most 1024 threads)
// and is never destroyed: its workers sleep between launches and end with the process.
class ThreadTeam {
public:
    // The team of this process (a child forked after a launch has none of the parent's threads,
    // so it builds its own; the parent's team is left to the parent).
    static ThreadTeam& of_this_process()
    {
        static ThreadTeam* team = new ThreadTeam;  // leaked on purpose: see above
        if (team->pid_ != getpid()) team = new ThreadTeam;
        return *team;
    }

    // Run job(t) on threads t = 0..threads-1 at once; return when every one has returned.
    // "" on success, else why the threads could not be started (then no job ran).
    template <typename Job>
    std::string run(unsigned int threads, const Job& job)
    {
        try {
            while (workers_.size() < threads) {
                auto worker = std::make_unique<Worker>();
                Worker& started = *worker;
                const unsigned int index = static_cast<unsigned int>(workers_.size());
                worker->thread = std::thread([this, &started, index] { serve(started, index); });
                worker->thread.detach();
                workers_.push_back(std::move(worker));
            }
        } catch (const std::system_error& error) {
            return std::string("could not start the block's threads: ") + error.what();
        }
        job_ = [&job](unsigned int index) { job(index); };
        remaining_.store(threads, std::memory_order_relaxed);
        finished_.store(0, std::memory_order_relaxed);
        for (unsigned int t = 0; t < threads; ++t) {
            workers_[t]->ticket.fetch_add(1, std::memory_order_release);  // publishes job_ too
            wake_all(workers_[t]->ticket);
        }
        while (finished_.load(std::memory_order_acquire) == 0) wait_while_equal(finished_, 0);
        return "";
    }

private:
    struct Worker {
        std::atomic<std::uint32_t> ticket{0};  // bumped once per launch this worker takes part in
        std::thread thread;
    };

    void serve(Worker& worker, unsigned int index)
    {
        std::uint32_t served = 0;
        for (;;) {
            while (worker.ticket.load(std::memory_order_acquire) == served) {
                wait_while_equal(worker.ticket, served);
            }
            ++served;
            job_(index);
            if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
                finished_.store(1, std::memory_order_release);
                wake_all(finished_);
            }
        }
    }

    const pid_t pid_ = getpid();
    std::vector<std::unique_ptr<Worker>> workers_;
    std::function<void(unsigned int)> job_;
    std::atomic<unsigned int> remaining_{0};
    std::atomic<std::uint32_t> finished_{0};
};

// Held by every launch, of any kernel (see launch).
inline std::mutex one_launch_at_a_time;

// Run kernel<<<grid, block>>>(args...) and wait for it. Returns "" on success, else the error.
// Blocks run one after another; the block's threads (the team's first block.x workers) run the
// whole launch and meet at the block barrier between blocks.
template <typename... Params>
std::string launch(void (*kernel)(Params...), dim3 grid, dim3 block,
                   std::type_identity_t<Params>... args)
{
    if (block.x == 0 || block.x % kWarpSize != 0 || block.x > kMaxThreadsPerBlock) {
        return "expected a block of 32..1024 threads in whole warps, was " +
               std::to_string(block.x) + " threads";
    }
    if (grid.x == 0) return "expected a grid of at least 1 block, was 0";
    if (grid.y != 1 || grid.z != 1 || block.y != 1 || block.z != 1) {
        return "only 1-D grids and blocks are emulated";
    }

    // One launch at a time in the process, whatever the kernel: __shared__ variables are function
    // statics, launch_error is one string, and the team serves one launch at a time. (A static
    // mutex here would be one per instantiation of this template, i.e. per kernel signature: two
    // threads launching two different kernels would hand the team two jobs at once and deadlock.)
    std::lock_guard<std::mutex> lock(one_launch_at_a_time);
    launch_error.clear();

    Block state(block.x);
    auto run_thread = [&](unsigned int thread_index) {
        // Every launch starts from fresh thread_local state, as a newly created thread would.
        threadIdx = dim3{thread_index, 0, 0};
        blockDim = block;
        gridDim = grid;
        current_block = &state;
        shuffle_count = 0;
        barrier_count = 0;
        for (unsigned int b = 0; b < grid.x; ++b) {
            blockIdx = dim3{b, 0, 0};
            kernel(args...);
            state.barrier.arrive_and_wait();  // the next block starts when this one has finished
        }
        current_block = nullptr;
    };
    const std::string error = ThreadTeam::of_this_process().run(block.x, run_thread);
    return error.empty() ? launch_error : error;
}

}  // namespace cuda_emulator
