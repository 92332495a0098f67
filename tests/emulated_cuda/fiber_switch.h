// Switching between fibers (stacks of their own in one OS thread) for the CUDA emulation's
// scheduler (emulated_cuda.cpp). On x86-64 a switch saves the callee-saved registers, the SSE
// and x87 control words and the stack pointer, and loads the other fiber's: no system call,
// where ucontext's swapcontext makes one to save the signal mask (and ASan clears the whole
// target stack's shadow on each), which made the emulated kernel tests several times slower.
// Elsewhere it is ucontext. Sanitizer annotations are the caller's.
#pragma once

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace gnmr::cuda {

struct FiberContext {
#if defined(__x86_64__)
  void* stack_pointer = nullptr;
#else
  ucontext_t context{};
#endif
};

// The first switch to `context` runs entry() on [stack, stack + bytes); entry never returns.
void fiber_prepare(FiberContext& context, char* stack, size_t bytes, void (*entry)());
// Saves the running fiber in `from` and resumes `to`; returns when something switches back.
void fiber_switch(FiberContext& from, FiberContext& to);

}  // namespace gnmr::cuda
