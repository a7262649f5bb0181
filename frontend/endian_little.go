//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package frontend

// hostLittleEndian lets the decoder copy little-endian wire bytes into
// native slices with one memmove.
const hostLittleEndian = true
