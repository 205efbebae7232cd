// OpenBLAS's cblas.h for the CPU backend. The header uses C99 `_Complex`, which -Wpedantic rejects in
// C++ (clang, asan preset) because it is found through -I rather than as a system header.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include <cblas.h>
#pragma GCC diagnostic pop
