// Package mallocfrag leaves glibc's heap holding freed pages that it does
// not return by itself, for tests of what gives them back
// (device.ReleaseHeap).
package mallocfrag

/*
#include <pthread.h>
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

struct threadJob {
	size_t total, block;
	int ok;
};

// threadTopRun allocates job->total bytes in blocks, writes every page,
// and frees them newest first, so they all merge into the arena's top.
static void *threadTopRun(void *arg) {
	struct threadJob *job = arg;
	size_t n = job->total / job->block;
	void **blocks = malloc(n * sizeof(void *));
	if (blocks == NULL) return NULL;
	size_t got = 0;
	for (; got < n; got++) {
		blocks[got] = malloc(job->block);
		if (blocks[got] == NULL) break;
		memset(blocks[got], 1, job->block);
	}
	for (size_t i = got; i > 0; i--) free(blocks[i - 1]);
	free(blocks);
	job->ok = got == n;
	return NULL;
}

// threadTop raises glibc's thresholds as a large free does (raise bytes,
// mmapped, then freed), then runs threadTopRun on a new thread.
static int threadTop(size_t total, size_t block, size_t raise) {
	void *big = malloc(raise);
	if (big == NULL) return 0;
	free(big);
	struct threadJob job = {total, block, 0};
	pthread_t t;
	if (pthread_create(&t, NULL, threadTopRun, &job) != 0) return 0;
	pthread_join(t, NULL);
	return job.ok;
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

// ThreadTop leaves total bytes free but resident at the top of the arena a
// new thread allocates from, as XLA's threads leave the temporaries of a
// large batch: it first frees a large mmapped block, which raises glibc's
// trim threshold to twice that block (here 2*total), so that the new
// thread's frees stay below it and nothing is trimmed on free.
func ThreadTop(total int) error {
	if C.threadTop(C.size_t(total), C.size_t(1<<20), C.size_t(total)) == 0 {
		return errors.New("mallocfrag: thread allocation failed")
	}
	return nil
}
