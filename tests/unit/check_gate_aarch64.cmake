# check_gate_aarch64.cmake -- src/proc/gate.S assembles for aarch64 in the shape gate.h describes: one stub per
# gate that branches to the common code, which marks the thread (a TLS record), CALLS the target (blr, never a
# tail branch), copies the stack argument slots, clears the mark with a release store and has the slow path.
# With QEMU (qemu-aarch64) and CUDA_INC, gate_shape.c is built with gate.S and run: the calls themselves.
#   cmake -DCC=aarch64-linux-gnu-gcc -DOBJDUMP=aarch64-linux-gnu-objdump -DSRC=src/proc -DOUT=x.o
#         [-DQEMU=qemu-aarch64 -DSHAPE=tests/unit/gate_shape.c -DCUDA_INC=/usr/local/cuda/include] -P this file
execute_process(COMMAND ${CC} -c -I${SRC} ${SRC}/gate.S -o ${OUT} RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "gate.S does not assemble for aarch64: ${err}")
endif()
execute_process(COMMAND ${OBJDUMP} -dr ${OUT} OUTPUT_VARIABLE dis RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${OBJDUMP} failed")
endif()
file(READ ${SRC}/gate.h h)
string(REGEX MATCH "#define GR_GATE_MAX ([0-9]+)" _ "${h}")
set(max ${CMAKE_MATCH_1})
string(REGEX MATCH "#define GR_GATE_STACK_SLOTS ([0-9]+)" _ "${h}")
set(slots ${CMAKE_MATCH_1})
if(NOT slots)
  message(FATAL_ERROR "gate.h defines no GR_GATE_STACK_SLOTS: gates that tail-jump leave their call uncounted")
endif()
string(REGEX MATCHALL "\tb\t[0-9a-f]+ <gr_gate_common>" to_common "${dis}")
string(REGEX MATCHALL "\tblr\tx16" calls "${dis}")
string(REGEX MATCHALL "\tbr\t" tail "${dis}")
string(REGEX MATCHALL "R_AARCH64_TLSIE_ADR_GOTTPREL_PAGE21\tgr_gate_tls" tls "${dis}")
string(REGEX MATCHALL "\tstlr\t" release "${dis}")
string(REGEX MATCHALL "\tldp\tq16, q17, " copies "${dis}")
list(LENGTH to_common nto)
list(LENGTH calls ncalls)
list(LENGTH tail ntail)
list(LENGTH tls ntls)
list(LENGTH release nrel)
list(LENGTH copies ncopies)
math(EXPR want_copies "${slots} / 4")
if(NOT nto EQUAL max OR NOT ncalls EQUAL 1 OR NOT ntail EQUAL 0 OR ntls LESS 1 OR NOT nrel EQUAL 1 OR
   NOT ncopies EQUAL want_copies OR NOT dis MATCHES "<gr_gate_common>:")
  message(FATAL_ERROR "aarch64 gates: ${nto} stubs branching to gr_gate_common (want ${max}), ${ncalls} calls of "
    "the target (want 1), ${ntail} tail branches (want 0), ${ntls} TLS record loads (want at least 1), ${nrel} "
    "release stores (want 1), ${ncopies} copies of 32 bytes of stack arguments (want ${want_copies})")
endif()
message(STATUS "aarch64: ${max} gates and their common code assembled in shape")
if(QEMU AND SHAPE AND CUDA_INC)
  execute_process(COMMAND ${CC} -static -O2 -D_GNU_SOURCE -I${SRC} -I${CUDA_INC} ${SHAPE} ${SRC}/gate.S
                          -o ${OUT}.shape RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "gate_shape.c does not build for aarch64: ${err}")
  endif()
  execute_process(COMMAND ${QEMU} ${OUT}.shape RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "gate shape: ok")
    message(FATAL_ERROR "gate_shape under ${QEMU}: exit ${rc}\n${out}${err}")
  endif()
  message(STATUS "aarch64 (${QEMU}): ${out}")
else()
  message(STATUS "aarch64 gates not run: no qemu-aarch64 (apt: qemu-user) or no libc for aarch64 "
                 "(apt: libc6-dev-arm64-cross)")
endif()
