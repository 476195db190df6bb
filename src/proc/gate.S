/*
 * gate.S -- GR_GATE_MAX gate trampolines (gate.h), each GR_GATE_STUB bytes, and their common slow path.
 *
 * A gate does not know its entry point's signature: awake, it touches no argument register and jumps to
 * gr_gate_target[i] (a tail jump: the callee returns straight to the caller). On the slow path it saves every
 * register that can carry an argument (x86-64: rdi rsi rdx rcx r8 r9, rax for varargs, xmm0-7; aarch64: x0-x8,
 * q0-q7), calls gr_gate_slow(i) and restores them; arguments on the stack are never touched.
 */
#include "gate.h"

#if defined(__x86_64__)
#if defined(__CET__)
#include <cet.h>
#define GATE_ENDBR endbr64
#else
#define GATE_ENDBR
#endif

        .text
        .hidden gr_gate_flag
        .hidden gr_gate_target
        .hidden gr_gate_slow
        .globl  gr_gate_stubs
        .hidden gr_gate_stubs
        .balign 64
gr_gate_stubs:
        .set    gate_i, 0
        .rept   GR_GATE_MAX
        .balign GR_GATE_STUB
        GATE_ENDBR
        cmpb    $0, gr_gate_flag(%rip)
        jne     1f
        jmp     *gr_gate_target+8*gate_i(%rip)
1:      movl    $gate_i, %r11d
        jmp     gr_gate_common
        .set    gate_i, gate_i + 1
        .endr
        .size   gr_gate_stubs, . - gr_gate_stubs

        .type   gr_gate_common, @function
gr_gate_common:
        pushq   %rbp
        movq    %rsp, %rbp
        subq    $192, %rsp
        movq    %rdi, 0(%rsp)
        movq    %rsi, 8(%rsp)
        movq    %rdx, 16(%rsp)
        movq    %rcx, 24(%rsp)
        movq    %r8, 32(%rsp)
        movq    %r9, 40(%rsp)
        movq    %rax, 48(%rsp)
        movdqu  %xmm0, 64(%rsp)
        movdqu  %xmm1, 80(%rsp)
        movdqu  %xmm2, 96(%rsp)
        movdqu  %xmm3, 112(%rsp)
        movdqu  %xmm4, 128(%rsp)
        movdqu  %xmm5, 144(%rsp)
        movdqu  %xmm6, 160(%rsp)
        movdqu  %xmm7, 176(%rsp)
        movl    %r11d, %edi
        call    gr_gate_slow
        movq    %rax, %r11
        movq    0(%rsp), %rdi
        movq    8(%rsp), %rsi
        movq    16(%rsp), %rdx
        movq    24(%rsp), %rcx
        movq    32(%rsp), %r8
        movq    40(%rsp), %r9
        movq    48(%rsp), %rax
        movdqu  64(%rsp), %xmm0
        movdqu  80(%rsp), %xmm1
        movdqu  96(%rsp), %xmm2
        movdqu  112(%rsp), %xmm3
        movdqu  128(%rsp), %xmm4
        movdqu  144(%rsp), %xmm5
        movdqu  160(%rsp), %xmm6
        movdqu  176(%rsp), %xmm7
        leave
        testq   %r11, %r11
        jz      2f
        jmp     *%r11
2:      movl    $2, %eax            /* CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation */
        ret
        .size   gr_gate_common, . - gr_gate_common

#elif defined(__aarch64__)

        .text
        .hidden gr_gate_flag
        .hidden gr_gate_target
        .hidden gr_gate_slow
        .globl  gr_gate_stubs
        .hidden gr_gate_stubs
        .balign 64
gr_gate_stubs:
        .set    gate_i, 0
        .rept   GR_GATE_MAX
        .balign GR_GATE_STUB
        hint    #34                 /* bti c: a target of indirect calls */
        adrp    x16, gr_gate_flag
        ldrb    w16, [x16, :lo12:gr_gate_flag]
        cbnz    w16, 1f
        adrp    x16, gr_gate_target + 8 * gate_i
        ldr     x16, [x16, :lo12:gr_gate_target + 8 * gate_i]
        br      x16
1:      mov     x17, #gate_i
        b       gr_gate_common
        .set    gate_i, gate_i + 1
        .endr
        .size   gr_gate_stubs, . - gr_gate_stubs

        .type   gr_gate_common, %function
gr_gate_common:
        stp     x29, x30, [sp, #-224]!
        mov     x29, sp
        stp     x0, x1, [sp, #16]
        stp     x2, x3, [sp, #32]
        stp     x4, x5, [sp, #48]
        stp     x6, x7, [sp, #64]
        str     x8, [sp, #80]
        stp     q0, q1, [sp, #96]
        stp     q2, q3, [sp, #128]
        stp     q4, q5, [sp, #160]
        stp     q6, q7, [sp, #192]
        mov     w0, w17
        bl      gr_gate_slow
        mov     x16, x0
        ldp     x0, x1, [sp, #16]
        ldp     x2, x3, [sp, #32]
        ldp     x4, x5, [sp, #48]
        ldp     x6, x7, [sp, #64]
        ldr     x8, [sp, #80]
        ldp     q0, q1, [sp, #96]
        ldp     q2, q3, [sp, #128]
        ldp     q4, q5, [sp, #160]
        ldp     q6, q7, [sp, #192]
        ldp     x29, x30, [sp], #224
        cbz     x16, 2f
        br      x16
2:      mov     w0, #2              /* CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation */
        ret
        .size   gr_gate_common, . - gr_gate_common

#else
#error "gate.S: gates are written for x86-64 and aarch64 only"
#endif

        .section .note.GNU-stack, "", %progbits
