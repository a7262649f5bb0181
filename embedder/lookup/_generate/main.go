// Command _generate writes the amd64 gather + sum-pool kernels of package
// lookup with avo. Run it through `go generate` in embedder/lookup; the
// generated pool_amd64.s and pool_amd64_stubs.go are committed, so a plain
// `go build` needs neither avo nor this module.
package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// rowBytes is one embedding row: 128 float32 (lookup.Dim). The kernels are
// written for this width only; package lookup refuses any other.
const (
	rowBytes = 128 * 4
	rowShift = 9 // log2(rowBytes)
	lineSize = 64
)

// vector describes one SIMD flavour: how many registers hold a row.
type vector struct {
	name  string
	bytes int // register width in bytes
	alloc func() reg.VecVirtual
}

func main() {
	ConstraintExpr("amd64,gc,!noasm")
	for _, v := range []vector{
		{name: "poolAVX512", bytes: 64, alloc: ZMM},
		{name: "poolAVX2", bytes: 32, alloc: YMM},
	} {
		pool(v)
	}
	Generate()
}

// pool emits one kernel. The ids of the batch are one flat stream (example
// by example, bag by bag, in table order); the kernel walks it twice at
// once: the pooling cursor, which sums each bag in registers and stores the
// pooled row once, and a prefetch cursor dist rows ahead, which issues a
// PREFETCHT2 for every cache line of the row it points at. Keeping dist rows
// of misses in flight is what turns a DRAM-latency bound loop into a
// bandwidth bound one; prefetching into L2 rather than L1 keeps them from
// holding the L1 fill buffers the loads need (see DefaultPrefetchRows).
// Rows of a bag are added first to last, the order of the plain-Go kernel,
// so results are bit-identical to it.
func pool(v vector) {
	TEXT(v.name, NOSPLIT, "func(out *float32, ids *int32, n int, bases *uintptr, hot *int, ntab int, pos *uintptr, width int, dist int)")
	Pragma("noescape")
	Doc(
		v.name+" sum-pools n examples of width ids each into out (n*ntab rows).",
		"bases[t] is table t's first row and hot[t] its bag size (>= 1);",
		"pos[p] is the table base of the id at position p of an example, for",
		"the prefetch cursor. Every id must already be checked against its table.",
	)
	out := Load(Param("out"), GP64())
	idp := Load(Param("ids"), GP64())
	bases := Load(Param("bases"), GP64())
	hot := Load(Param("hot"), GP64())
	pos := Load(Param("pos"), GP64())

	Comment("end = ids + n*width*4: where both cursors stop.")
	end := Load(Param("n"), GP64())
	IMULQ(paramAddr("width"), end)
	LEAQ(Mem{Base: idp, Index: end, Scale: 4}, end)

	Comment("Prefetch cursor: pk walks the ids, pp is its position in an example.")
	pk := GP64()
	MOVQ(idp, pk)
	pp := GP64()
	XORQ(pp, pp)

	// prefetch issues the prefetches for the row under the prefetch cursor
	// and advances it, wrapping its position at the end of an example.
	n := 0
	prefetch := func() {
		n++
		skip := fmt.Sprintf("%s_pfskip%d", v.name, n)
		CMPQ(pk, end)
		JAE(LabelRef(skip))
		row := GP64()
		MOVLQSX(Mem{Base: pk}, row)
		SHLQ(U8(rowShift), row)
		ADDQ(Mem{Base: pos, Index: pp, Scale: 8}, row)
		for off := 0; off < rowBytes; off += lineSize {
			PREFETCHT2(Mem{Base: row, Disp: off})
		}
		ADDQ(U8(4), pk)
		INCQ(pp)
		CMPQ(pp, paramAddr("width"))
		JB(LabelRef(skip))
		XORQ(pp, pp)
		Label(skip)
	}

	Comment("Warm up: put the first dist rows in flight.")
	warm := Load(Param("dist"), GP64())
	TESTQ(warm, warm)
	JLE(LabelRef(v.name + "_start"))
	Label(v.name + "_warm")
	prefetch()
	DECQ(warm)
	JNZ(LabelRef(v.name + "_warm"))

	Label(v.name + "_start")
	CMPQ(idp, end)
	JAE(LabelRef(v.name + "_done"))

	regs := rowBytes / v.bytes
	acc := make([]reg.VecVirtual, regs)
	for i := range acc {
		acc[i] = v.alloc()
	}

	Label(v.name + "_example")
	t := GP64()
	XORQ(t, t)

	Label(v.name + "_table")
	h := GP64()
	MOVQ(Mem{Base: hot, Index: t, Scale: 8}, h)
	base := GP64()
	MOVQ(Mem{Base: bases, Index: t, Scale: 8}, base)

	Comment("First row of the bag: load.")
	row := GP64()
	MOVLQSX(Mem{Base: idp}, row)
	SHLQ(U8(rowShift), row)
	ADDQ(base, row)
	ADDQ(U8(4), idp)
	for i, a := range acc {
		VMOVUPS(Mem{Base: row, Disp: i * v.bytes}, a)
	}
	prefetch()
	DECQ(h)
	JZ(LabelRef(v.name + "_store"))

	Comment("Every further row: add.")
	Label(v.name + "_bag")
	MOVLQSX(Mem{Base: idp}, row)
	SHLQ(U8(rowShift), row)
	ADDQ(base, row)
	ADDQ(U8(4), idp)
	for i, a := range acc {
		VADDPS(Mem{Base: row, Disp: i * v.bytes}, a, a)
	}
	prefetch()
	DECQ(h)
	JNZ(LabelRef(v.name + "_bag"))

	Label(v.name + "_store")
	for i, a := range acc {
		VMOVUPS(a, Mem{Base: out, Disp: i * v.bytes})
	}
	ADDQ(U32(rowBytes), out)
	INCQ(t)
	CMPQ(t, paramAddr("ntab"))
	JB(LabelRef(v.name + "_table"))

	CMPQ(idp, end)
	JB(LabelRef(v.name + "_example"))

	Label(v.name + "_done")
	VZEROUPPER()
	RET()
}

// paramAddr returns the frame address of a scalar argument, for operands
// read in place rather than held in a register.
func paramAddr(name string) Mem {
	b, err := Param(name).Resolve()
	if err != nil {
		panic(fmt.Sprintf("param %s: %v", name, err))
	}
	return b.Addr
}
