//go:build !linux

package main

import "context"

// reapOrphans only waits: pid namespaces, and orphans to reap, are Linux's.
func reapOrphans(ctx context.Context) { <-ctx.Done() }
