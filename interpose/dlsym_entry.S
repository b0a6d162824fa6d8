/* libstensor.so's exported dlsym. Only a lookup of a driver entry point
   ("cu" and a capital) or of an NVML one ("nvml"), any handle but
   RTLD_NEXT, goes to stensor_dlsym (interpose/interpose.cc), which hands
   out stensor's hooks; every other one jumps to the C library's dlsym
   with the caller's return address in place. That matters twice. dlsym(RTLD_NEXT, name) means "the next
   definition after the calling object", told by that return address: a
   hook that called the C library's dlsym would make libstensor.so the
   caller, handing an interposer loaded after stensor its own definition
   back (a wrapper of a C library function then recurses for ever). And a
   sanitizer runtime looks up what it intercepts while it starts, before
   instrumented code may run: those lookups touch no C++ code here. */
        .text
        .globl  dlsym
        .type   dlsym, @function
dlsym:
        .cfi_startproc
        cmpq    $-1, %rdi                    /* RTLD_NEXT: always the C library */
        je      0f
        testq   %rsi, %rsi
        jz      0f
        cmpb    $'c', (%rsi)
        jne     4f
        cmpb    $'u', 1(%rsi)
        jne     0f
        movzbl  2(%rsi), %eax
        subl    $'A', %eax
        cmpl    $25, %eax
        jbe     stensor_dlsym                /* "cu" + capital: a driver name */
        jmp     0f
4:      cmpb    $'n', (%rsi)                 /* byte by byte: stops at a NUL */
        jne     0f
        cmpb    $'v', 1(%rsi)
        jne     0f
        cmpb    $'m', 2(%rsi)
        jne     0f
        cmpb    $'l', 3(%rsi)
        je      stensor_dlsym                /* "nvml": an NVML name */
0:      movq    stensor_real_dlsym(%rip), %rax
        testq   %rax, %rax
        jz      1f
        jmp     *%rax
1:      /* First use: the C library's dlsym, by version (dlvsym is not
           interposed; RTLD_NEXT from here is the C library's). */
        pushq   %rdi
        .cfi_adjust_cfa_offset 8
        pushq   %rsi
        .cfi_adjust_cfa_offset 8
        subq    $8, %rsp                     /* 16-byte alignment at the call */
        .cfi_adjust_cfa_offset 8
        movq    $-1, %rdi
        leaq    .Lname(%rip), %rsi
        leaq    .Lv234(%rip), %rdx
        call    dlvsym@PLT
        testq   %rax, %rax
        jnz     2f
        movq    $-1, %rdi
        leaq    .Lname(%rip), %rsi
        leaq    .Lv225(%rip), %rdx
        call    dlvsym@PLT
2:      addq    $8, %rsp
        .cfi_adjust_cfa_offset -8
        popq    %rsi
        .cfi_adjust_cfa_offset -8
        popq    %rdi
        .cfi_adjust_cfa_offset -8
        testq   %rax, %rax
        jz      3f                           /* no dlsym at all: C++ says so */
        movq    %rax, stensor_real_dlsym(%rip)
        jmp     *%rax
3:      jmp     stensor_dlsym
        .cfi_endproc
        .size   dlsym, .-dlsym

        .section .rodata
.Lname: .string "dlsym"
.Lv234: .string "GLIBC_2.34"
.Lv225: .string "GLIBC_2.2.5"

        .bss
        .align  8
        .globl  stensor_real_dlsym
        .hidden stensor_real_dlsym
        .type   stensor_real_dlsym, @object
        .size   stensor_real_dlsym, 8
stensor_real_dlsym:
        .zero   8

        .section .note.GNU-stack,"",@progbits
