// fiber_switch.h. x86-64 System V: rbx, rbp, r12-r15, MXCSR and the x87 control word are the
// callee-saved state; a call leaves rsp 8 bytes below a 16-byte boundary at function entry.
#include "emulated_cuda/fiber_switch.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)

// gnmr_fiber_switch(void** save_sp, void* load_sp): pushes the callee-saved registers and the
// control words, saves rsp in *save_sp, loads load_sp and pops the other fiber's.
asm(R"(
  .text
  .p2align 4
  .globl gnmr_fiber_switch
  .hidden gnmr_fiber_switch
  .type gnmr_fiber_switch, @function
gnmr_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size gnmr_fiber_switch, .-gnmr_fiber_switch
)");

extern "C" void gnmr_fiber_switch(void** save_sp, void* load_sp);

namespace gnmr::cuda {

// The frame gnmr_fiber_switch pops, from the lowest address: the control words, r15, r14,
// r13, r12, rbx, rbp, then the address its `ret` goes to.
struct InitialFrame {
  uint32_t mxcsr;
  uint16_t x87_control, unused;
  uint64_t r15, r14, r13, r12, rbx, rbp;
  uint64_t return_address;
};
static_assert(sizeof(InitialFrame) == 64, "gnmr_fiber_switch pops 64 bytes");

void fiber_prepare(FiberContext& context, char* stack, size_t bytes, void (*entry)()) {
  // After the 64-byte frame is popped entry() starts with rsp = top - 8: 8 below a 16-byte
  // boundary, as if called.
  const uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t{15};
  InitialFrame* frame = reinterpret_cast<InitialFrame*>(top - 8 - sizeof(InitialFrame));
  std::memset(frame, 0, sizeof *frame);
  uint32_t mxcsr = 0;
  uint16_t x87_control = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(x87_control));
  frame->mxcsr = mxcsr;
  frame->x87_control = x87_control;
  frame->return_address = reinterpret_cast<uint64_t>(entry);
  context.stack_pointer = frame;
}

void fiber_switch(FiberContext& from, FiberContext& to) {
  gnmr_fiber_switch(&from.stack_pointer, to.stack_pointer);
}

}  // namespace gnmr::cuda

#else

namespace gnmr::cuda {

void fiber_prepare(FiberContext& context, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&context.context);
  context.context.uc_stack.ss_sp = stack;
  context.context.uc_stack.ss_size = bytes;
  context.context.uc_link = nullptr;
  makecontext(&context.context, entry, 0);
}

void fiber_switch(FiberContext& from, FiberContext& to) {
  swapcontext(&from.context, &to.context);
}

}  // namespace gnmr::cuda

#endif
