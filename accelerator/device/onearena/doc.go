// Package onearena, imported for its effect, makes every thread of the
// process allocate from glibc's main arena, the one arena whose free top
// malloc_trim gives back (device.ReleaseHeap).
//
// glibc gives each thread that allocates an arena of its own, up to eight
// per core, and shrinks a thread arena's top only when a free leaves it
// above the trim threshold, which freeing a large block raises to as much
// as 64 MiB; malloc_trim does not shrink those tops at all. So what XLA's
// threads left at their arenas' tops stayed resident whatever the
// accelerator released: on MLPerf's network, 40-45 MiB once start-up
// calibration had run the largest buckets.
//
// The price is paid while compiling: XLA's compile threads then contend
// for the one arena's lock (on a 2-core VM, context switches 9k -> 74-85k
// and a 13-bucket compile 2.6-3.0 s -> 3.5-4.2 s). Serving throughput did
// not move beyond the noise. MALLOC_ARENA_MAX=8 undoes it.
//
// The limit is set from a C constructor, before the Go runtime starts a
// thread: a thread that allocated before it would keep an arena of its
// own. A limit the operator set (MALLOC_ARENA_MAX, or glibc.malloc.
// arena_max in GLIBC_TUNABLES) is left as it is.
package onearena
