#pragma once
// <immintrin.h> for the AVX-512 files. GCC 12's AVX-512 headers seed
// intrinsics with self-initialised "undefined" vectors, which -Wuninitialized
// flags at every use; the warnings are silenced for the header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__  // a GCC-only group: clang warns that it does not know it
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
