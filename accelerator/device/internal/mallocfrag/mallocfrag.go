// Package mallocfrag leaves glibc's heap holding freed pages that it does
// not return by itself, for tests of what gives them back
// (device.ReleaseHeap).
package mallocfrag

/*
#include <stdlib.h>
#include <string.h>

// fill allocates n blocks of size bytes, writes every page of each, and
// frees all but the last, which keeps the arena's top in use so that the
// freed ones are not trimmed on free. It returns the last block.
static void *fill(int n, size_t size) {
	void **blocks = malloc(n * sizeof(void *));
	if (blocks == NULL) return NULL;
	int got = 0;
	for (; got < n; got++) {
		blocks[got] = malloc(size);
		if (blocks[got] == NULL) break;
		memset(blocks[got], 1, size);
	}
	void *last = got > 0 ? blocks[got - 1] : NULL;
	for (int i = 0; i + 1 < got; i++) free(blocks[i]);
	free(blocks);
	return last;
}
*/
import "C"

import (
	"errors"
	"unsafe"
)

// BlockBytes is the size of the blocks Fill allocates: below glibc's
// mmap threshold (128 KiB), so they come from an arena.
const BlockBytes = 64 << 10

// Fill allocates total bytes in blocks of BlockBytes from glibc's heap,
// touches them, and frees all but the last. The freed pages stay resident
// until something trims the heap; free releases the last block.
func Fill(total int) (free func(), err error) {
	last := C.fill(C.int(total/BlockBytes), C.size_t(BlockBytes))
	if last == nil {
		return nil, errors.New("mallocfrag: malloc failed")
	}
	return func() { C.free(unsafe.Pointer(last)) }, nil
}
