package onearena

/*
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

static int limited;

__attribute__((constructor)) static void recmeshOneArena(void) {
	if (getenv("MALLOC_ARENA_MAX") != NULL) return;
	const char *tunables = getenv("GLIBC_TUNABLES");
	if (tunables != NULL && strstr(tunables, "glibc.malloc.arena_max") != NULL) return;
	limited = mallopt(M_ARENA_MAX, 1) == 1;
}

static int oneArenaSet(void) { return limited; }
*/
import "C"

// Set reports whether the process allocates from one arena because of this
// package (false where the operator set a limit of their own).
func Set() bool { return C.oneArenaSet() == 1 }
