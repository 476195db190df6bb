# cmake -P output_matches.cmake, with OUT (a file) and RE (a regular expression) in the environment: fails
# unless the file's text matches RE, read as CTest reads PASS_REGULAR_EXPRESSION (CMake's regex syntax, "."
# matching newlines too). run_test.sh uses it for --expect.
file(READ "$ENV{OUT}" out)
if(NOT out MATCHES "$ENV{RE}")
  message(FATAL_ERROR "the output does not match: $ENV{RE}")
endif()
