// emulator_driver.cpp: clip.cu compiled for the CPU, behind one C entry point for ctypes.
//
// emulator_launch() takes its kernel arguments the way cuLaunchKernel (and so CuPy) does: an
// array of pointers to the argument values. It also takes their sizes and checks them against the
// kernel's real signature, so the host code that builds the argument list for CuPy is checked
// here too: a float passed where the kernel expects a long long is an error, not a wrong result.
#include "cuda_emulator.h"

#include "clip.cu"

#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

namespace {

template <typename... Params, std::size_t... I>
std::string launch_unpacked(void (*kernel)(Params...), dim3 grid, dim3 block, void** params,
                            std::index_sequence<I...>)
{
    return cuda_emulator::launch(kernel, grid, block, *static_cast<Params*>(params[I])...);
}

template <typename... Params>
std::string launch_packed(const char* name, void (*kernel)(Params...), unsigned int grid,
                          unsigned int block, void** params, const std::size_t* param_sizes,
                          int param_count)
{
    constexpr std::size_t expected_sizes[] = {sizeof(Params)...};
    if (param_count != static_cast<int>(sizeof...(Params))) {
        return std::string(name) + ": expected " + std::to_string(sizeof...(Params)) +
               " arguments, was " + std::to_string(param_count);
    }
    for (int i = 0; i < param_count; ++i) {
        if (param_sizes[i] != expected_sizes[i]) {
            return std::string(name) + ": argument " + std::to_string(i) + ": expected " +
                   std::to_string(expected_sizes[i]) + " bytes, was " +
                   std::to_string(param_sizes[i]);
        }
    }
    return launch_unpacked(kernel, dim3{grid, 1, 1}, dim3{block, 1, 1}, params,
                           std::index_sequence_for<Params...>{});
}

using Launcher = std::string (*)(unsigned int, unsigned int, void**, const std::size_t*, int);

struct KernelEntry {
    const char* name;
    Launcher launch;
};

#define EMULATED_KERNEL(kernel)                                                                  \
    KernelEntry                                                                                  \
    {                                                                                            \
        #kernel, [](unsigned int grid, unsigned int block, void** params,                        \
                    const std::size_t* sizes, int count) {                                       \
            return launch_packed(#kernel, kernel, grid, block, params, sizes, count);            \
        }                                                                                        \
    }

const KernelEntry kKernels[] = {
    EMULATED_KERNEL(k_grad_norm_partial),
    EMULATED_KERNEL(k_grad_norm_final),
    EMULATED_KERNEL(k_grad_scale),
};

thread_local std::string last_error;

}  // namespace

// Space-separated names of the kernels this library can launch.
extern "C" const char* emulator_kernel_names()
{
    static const std::string names = [] {
        std::string joined;
        for (const KernelEntry& entry : kKernels) {
            joined += (joined.empty() ? "" : " ") + std::string(entry.name);
        }
        return joined;
    }();
    return names.c_str();
}

// Runs kernel_name<<<grid, block>>>(*params[0], *params[1], ...) to completion.
// Returns NULL on success, else an error message (valid until the next call on this thread).
extern "C" const char* emulator_launch(const char* kernel_name, unsigned int grid,
                                       unsigned int block, void** params,
                                       const std::size_t* param_sizes, int param_count)
{
    last_error = std::string("unknown kernel ") + kernel_name;
    for (const KernelEntry& entry : kKernels) {
        if (std::strcmp(entry.name, kernel_name) == 0) {
            last_error = entry.launch(grid, block, params, param_sizes, param_count);
            break;
        }
    }
    return last_error.empty() ? nullptr : last_error.c_str();
}

// clip.cu's bit-level conversions, element by element, for the tests: fp32 -> bf16 is the routine
// sm_75 GPUs run (float_to_bfloat16_bits_rne; sm_80+ use cvt.rn.bf16.f32), bf16 -> fp32 is the
// one every GPU runs, and fp32 -> fp16 the CPU's (GPUs use cvt.rn.f16.f32).
extern "C" void emulator_float_to_bfloat16(const float* values, unsigned short* bits, std::size_t count)
{
    for (std::size_t i = 0; i < count; ++i) bits[i] = float_to_bfloat16_bits_rne(values[i]);
}

extern "C" void emulator_bfloat16_to_float(const unsigned short* bits, float* values, std::size_t count)
{
    for (std::size_t i = 0; i < count; ++i) values[i] = bfloat16_bits_to_float(bits[i]);
}

extern "C" void emulator_float_to_half(const float* values, unsigned short* bits, std::size_t count)
{
    for (std::size_t i = 0; i < count; ++i) bits[i] = float_to_half_bits(values[i]);
}
