// Package e2e holds the end-to-end tests of the mesh: every process real
// (embedder, accelerator, frontends), driven over gRPC, every score
// compared with the plain-Go reference.
package e2e
