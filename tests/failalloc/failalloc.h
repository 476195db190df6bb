/* failalloc.h -- what a call asked of gr_failalloc_fail() was (see failalloc.c). */
#ifndef GR_FAILALLOC_H
#define GR_FAILALLOC_H

enum { FA_MALLOC, FA_CALLOC, FA_REALLOC, FA_ALIGNED, FA_MMAP, FA_KINDS };

#endif
