/*
 * gate.S -- GR_GATE_MAX gate trampolines (gate.h), each GR_GATE_STUB bytes, and the code they share.
 *
 * A gate does not know its entry point's signature. A stub puts its index in a scratch register (x86-64 r11,
 * aarch64 x17) and jumps to gr_gate_common, which touches no argument register on its way to the call: it
 * marks the thread in flight (its record's counter, found through the thread-local gr_gate_tls), fences only
 * where membarrier is missing (gr_gate_fence), reads the flag and, clear, copies GR_GATE_STACK_SLOTS argument
 * slots of the caller's stack under its own frame and CALLS gr_gate_target[i] (a tail jump would leave the
 * call unmarked while it runs), then clears the mark (a release store) and returns the function's result
 * registers untouched (x86-64 rax, rdx, xmm0-1, st0; aarch64 x0-x7, q0-q7; memory through rdi / x8).
 * Flag set, or no record yet: the mark is taken back, every register that can carry an argument is saved
 * (x86-64: rdi rsi rdx rcx r8 r9, rax for varargs, xmm0-7; aarch64: x0-x8, q0-q7), gr_gate_slow(i) runs (it
 * waits for a wake and returns the target with the thread marked, or NULL) and they are restored; NULL makes
 * the gate return CUDA_ERROR_OUT_OF_MEMORY. Scratch: x86-64 r10, r11, xmm8; aarch64 x9, x10, x16, x17, q16-q17.
 */
#include "gate.h"

#define GATE_COPY (8 * GR_GATE_STACK_SLOTS)

#if defined(__x86_64__)
#if defined(__CET__)
#include <cet.h>
#define GATE_ENDBR endbr64
#else
#define GATE_ENDBR
#endif

/* The frame under the saved rbp: the copied slots at 0, the record at GATE_COPY, 8 bytes unused (alignment). */
#define GATE_FRAME (GATE_COPY + 16)
#define GATE_REC GATE_COPY

        .text
        .hidden gr_gate_flag
        .hidden gr_gate_fence
        .hidden gr_gate_target
        .hidden gr_gate_slow
        .hidden gr_gate_tls
        .globl  gr_gate_stubs
        .hidden gr_gate_stubs
        .balign 64
gr_gate_stubs:
        .set    gate_i, 0
        .rept   GR_GATE_MAX
        .balign GR_GATE_STUB
        GATE_ENDBR
        movl    $gate_i, %r11d
        jmp     gr_gate_common
        .set    gate_i, gate_i + 1
        .endr
        .globl  gr_gate_stubs_end            /* gate.c checks that every stub kept to GR_GATE_STUB bytes */
        .hidden gr_gate_stubs_end
        .balign GR_GATE_STUB
gr_gate_stubs_end:
        .size   gr_gate_stubs, . - gr_gate_stubs

        .balign 16
        .type   gr_gate_common, @function
gr_gate_common:
        .cfi_startproc
        pushq   %rbp
        .cfi_def_cfa_offset 16
        .cfi_offset %rbp, -16
        movq    %rsp, %rbp
        .cfi_def_cfa_register %rbp
        subq    $GATE_FRAME, %rsp
        movq    gr_gate_tls@gottpoff(%rip), %r10
        movq    %fs:(%r10), %r10
        testq   %r10, %r10
        jz      .Lslow
        addq    $1, GR_GATE_REC_INFLIGHT(%r10)      /* marked: only this thread writes it */
        cmpb    $0, gr_gate_fence(%rip)
        jne     .Lfence
.Lfenced:
        cmpb    $0, gr_gate_flag(%rip)
        jne     .Lunmark
        movq    %r10, GATE_REC(%rsp)
        leaq    gr_gate_target(%rip), %r10
        movq    (%r10,%r11,8), %r11
.Lcall:                                             /* r11: the target; the record at GATE_REC(%rsp) */
        .set    gate_k, 0
        .rept   GR_GATE_STACK_SLOTS / 2
        movdqu  16+16*gate_k(%rbp), %xmm8
        movdqu  %xmm8, 16*gate_k(%rsp)
        .set    gate_k, gate_k + 1
        .endr
        call    *%r11
        movq    GATE_REC(%rsp), %r10
        subq    $1, GR_GATE_REC_INFLIGHT(%r10)      /* a plain store: release on x86-64 */
        .cfi_remember_state
        leave
        .cfi_def_cfa %rsp, 8
        ret
        .cfi_restore_state
.Lfence:
        lock orq $0, (%rsp)
        jmp     .Lfenced
.Lunmark:
        subq    $1, GR_GATE_REC_INFLIGHT(%r10)
.Lslow:
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
        addq    $192, %rsp
        testq   %r11, %r11
        jz      .Lfail
        movq    gr_gate_tls@gottpoff(%rip), %r10    /* marked by gr_gate_slow, which gave it a record */
        movq    %fs:(%r10), %r10
        movq    %r10, GATE_REC(%rsp)
        jmp     .Lcall
.Lfail:
        movl    $2, %eax            /* CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation */
        leave
        .cfi_def_cfa %rsp, 8
        ret
        .cfi_endproc
        .size   gr_gate_common, . - gr_gate_common

#elif defined(__aarch64__)

/* The frame: the copied slots at 0, the record at GATE_REC, x29 and x30 at GATE_FP; x29 points there, so the
 * caller's stack arguments begin at x29 + 16. */
#define GATE_REC GATE_COPY
#define GATE_FP (GATE_COPY + 16)
#define GATE_FRAME (GATE_COPY + 32)

        .text
        .hidden gr_gate_flag
        .hidden gr_gate_fence
        .hidden gr_gate_target
        .hidden gr_gate_slow
        .hidden gr_gate_tls
        .globl  gr_gate_stubs
        .hidden gr_gate_stubs
        .balign 64
gr_gate_stubs:
        .set    gate_i, 0
        .rept   GR_GATE_MAX
        .balign GR_GATE_STUB
        hint    #34                 /* bti c: a target of indirect calls */
        mov     x17, #gate_i
        b       gr_gate_common
        .set    gate_i, gate_i + 1
        .endr
        .globl  gr_gate_stubs_end            /* gate.c checks that every stub kept to GR_GATE_STUB bytes */
        .hidden gr_gate_stubs_end
        .balign GR_GATE_STUB
gr_gate_stubs_end:
        .size   gr_gate_stubs, . - gr_gate_stubs

        .balign 16
        .type   gr_gate_common, %function
gr_gate_common:
        .cfi_startproc
        sub     sp, sp, #GATE_FRAME
        .cfi_def_cfa_offset GATE_FRAME
        stp     x29, x30, [sp, #GATE_FP]
        add     x29, sp, #GATE_FP
        .cfi_def_cfa x29, 16
        .cfi_offset x30, -8
        .cfi_offset x29, -16
        mrs     x9, tpidr_el0
        adrp    x10, :gottprel:gr_gate_tls
        ldr     x10, [x10, #:gottprel_lo12:gr_gate_tls]
        ldr     x9, [x9, x10]
        cbz     x9, .Lslow
        ldr     x10, [x9, #GR_GATE_REC_INFLIGHT]   /* marked: only this thread writes it */
        add     x10, x10, #1
        str     x10, [x9, #GR_GATE_REC_INFLIGHT]
        adrp    x10, gr_gate_fence
        ldrb    w10, [x10, :lo12:gr_gate_fence]
        cbnz    w10, .Lfence
.Lfenced:
        adrp    x10, gr_gate_flag
        ldrb    w10, [x10, :lo12:gr_gate_flag]
        cbnz    w10, .Lunmark
        str     x9, [sp, #GATE_REC]
        adrp    x10, gr_gate_target
        add     x10, x10, :lo12:gr_gate_target
        ldr     x16, [x10, x17, lsl #3]
.Lcall:                                            /* x16: the target; the record at [sp, #GATE_REC] */
        .set    gate_k, 0
        .rept   GR_GATE_STACK_SLOTS / 4
        ldp     q16, q17, [x29, #16 + 32 * gate_k]
        stp     q16, q17, [sp, #32 * gate_k]
        .set    gate_k, gate_k + 1
        .endr
        blr     x16
        ldr     x9, [sp, #GATE_REC]
        ldr     x10, [x9, #GR_GATE_REC_INFLIGHT]
        sub     x10, x10, #1
        stlr    x10, [x9]                          /* release: the call is over before the sleep sees 0 */
        ldp     x29, x30, [sp, #GATE_FP]
        add     sp, sp, #GATE_FRAME
        ret
.Lfence:
        dmb     ish
        b       .Lfenced
.Lunmark:
        ldr     x10, [x9, #GR_GATE_REC_INFLIGHT]
        sub     x10, x10, #1
        str     x10, [x9, #GR_GATE_REC_INFLIGHT]
.Lslow:
        sub     sp, sp, #208
        stp     x0, x1, [sp, #0]
        stp     x2, x3, [sp, #16]
        stp     x4, x5, [sp, #32]
        stp     x6, x7, [sp, #48]
        str     x8, [sp, #64]
        stp     q0, q1, [sp, #80]
        stp     q2, q3, [sp, #112]
        stp     q4, q5, [sp, #144]
        stp     q6, q7, [sp, #176]
        mov     w0, w17
        bl      gr_gate_slow
        mov     x16, x0
        ldp     x0, x1, [sp, #0]
        ldp     x2, x3, [sp, #16]
        ldp     x4, x5, [sp, #32]
        ldp     x6, x7, [sp, #48]
        ldr     x8, [sp, #64]
        ldp     q0, q1, [sp, #80]
        ldp     q2, q3, [sp, #112]
        ldp     q4, q5, [sp, #144]
        ldp     q6, q7, [sp, #176]
        add     sp, sp, #208
        cbz     x16, .Lfail
        mrs     x9, tpidr_el0                      /* marked by gr_gate_slow, which gave it a record */
        adrp    x10, :gottprel:gr_gate_tls
        ldr     x10, [x10, #:gottprel_lo12:gr_gate_tls]
        ldr     x9, [x9, x10]
        str     x9, [sp, #GATE_REC]
        b       .Lcall
.Lfail:
        mov     w0, #2              /* CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation */
        ldp     x29, x30, [sp, #GATE_FP]
        add     sp, sp, #GATE_FRAME
        ret
        .cfi_endproc
        .size   gr_gate_common, . - gr_gate_common

#else
#error "gate.S: gates are written for x86-64 and aarch64 only"
#endif

        .section .note.GNU-stack, "", %progbits
