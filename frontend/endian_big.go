//go:build !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package frontend

// hostLittleEndian is false here: the decoder converts element by element.
const hostLittleEndian = false
