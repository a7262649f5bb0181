// Command _generate writes the amd64 gather + sum-pool kernels of package
// lookup with avo. Run it through `go generate` in embedder/lookup; the
// generated pool_amd64.s and pool_amd64_stubs.go are committed, so a plain
// `go build` needs neither avo nor this module.
package main

import (
	"fmt"
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// dim is the width of an embedding row (lookup.Dim): the kernels are
// written for this width only, and package lookup refuses any other.
const (
	dim      = 128
	outBytes = dim * 4 // one pooled float32 row
	lineSize = 64
)

// vector describes one SIMD flavour.
type vector struct {
	name  string
	bytes int // register width in bytes
	alloc func() reg.VecVirtual
	// dequantRegs is how many accumulators hold a row segment in the
	// dequantizing kernels: their temporaries must fit beside them, so
	// AVX2 (16 registers) pools a bag in two passes of half a row each.
	dequantRegs int
}

var (
	avx512 = vector{name: "AVX512", bytes: 64, alloc: ZMM, dequantRegs: 8}
	avx2   = vector{name: "AVX2", bytes: 32, alloc: YMM, dequantRegs: 8}
)

// lanes is the float32 elements of one register.
func (v vector) lanes() int { return v.bytes / 4 }

// precision describes how one stored row (model.Dtype) becomes float32.
type precision struct {
	name     string // in the labels of its loop
	rowBytes int
	// index turns an id (in a register) into the row's byte offset.
	index func(r reg.GPVirtual)
	// dequant makes acc the values of a segment of the row at row (first
	// row of a bag) or adds them to acc (every further row).
	dequant func(v vector, row reg.GPVirtual, acc []reg.VecVirtual, seg int, first bool)
	// store writes segment seg of a bag's sum from acc to out; nil: the
	// registers in order. A loop whose dequant leaves elements in another
	// order puts them back here, once a bag instead of once a row.
	store func(v vector, out reg.Register, acc []reg.VecVirtual, seg int)
	fp32  bool // rows are float32: all of AVX2's 16 registers accumulate
}

// precisions are the loops of every kernel, in the order of
// model.Dtypes(): a kernel's prec argument is the index.
var precisions []precision

// Constants of the dequantizing kernels.
var (
	nibbles  Mem // 32 bytes of 0x0f: the low nibble of every byte
	zeros    Mem // 32 zero bytes: what the AVX2 int4 loop widens with
	quietBit Mem // 8 dwords of 1<<22: a float32's quiet-NaN bit
	// The AVX-512 int4 loop's (int4Table): levels is the float32 values
	// 0..15, qwordShift the shifts 0, 4, ..., 28 that bring nibbles q and
	// 8+q of a qword to the low bits of its two dwords, and unzip the
	// dword indexes that put those lanes back in element order.
	levels, qwordShift, unzip Mem
)

func main() {
	ConstraintExpr("amd64,gc,!noasm")
	nibbles = GLOBL("nibbles", RODATA|NOPTR)
	for i := 0; i < 32; i += 8 {
		DATA(i, U64(0x0f0f0f0f0f0f0f0f))
	}
	zeros = GLOBL("zeros", RODATA|NOPTR)
	for i := 0; i < 32; i += 8 {
		DATA(i, U64(0))
	}
	quietBit = GLOBL("quietbit", RODATA|NOPTR)
	for i := 0; i < 32; i += 4 {
		DATA(i, U32(1<<22))
	}
	levels = GLOBL("levels", RODATA|NOPTR)
	for q := 0; q < 16; q++ {
		DATA(4*q, U32(math.Float32bits(float32(q)))) // avo writes F32(1) as the integer 1
	}
	qwordShift = GLOBL("qwordshift", RODATA|NOPTR)
	for q := 0; q < 8; q++ {
		DATA(8*q, U64(uint64(4*q)))
	}
	unzip = GLOBL("unzip", RODATA|NOPTR)
	for e := 0; e < 16; e++ {
		DATA(4*e, U32(uint32(2*(e%8)+e/8)))
	}
	precisions = []precision{fp32, fp16, int8, int4}
	for _, v := range []vector{avx512, avx2} {
		pool(v)
	}
	Generate()
}

var fp32 = precision{
	rowBytes: 4 * dim,
	index:    func(r reg.GPVirtual) { SHLQ(U8(9), r) },
	fp32:     true,
	dequant: func(v vector, row reg.GPVirtual, acc []reg.VecVirtual, seg int, first bool) {
		for i, a := range acc {
			m := Mem{Base: row, Disp: i * v.bytes}
			if first {
				VMOVUPS(m, a)
			} else {
				VADDPS(m, a, a)
			}
		}
	},
}

// fp16 rows are 128 halves. VCVTPH2PS widens them exactly but quiets a
// signaling NaN, which model.Dtype (and the Go kernel) keep as they are:
// a bag of one row stores its first row unchanged, so the first row of
// every bag has bit 22 of its NaN lanes set back to the half's bit 9. A
// further row is added, and the add quiets every NaN either way.
var fp16 = precision{
	name:     "FP16",
	rowBytes: 2 * dim,
	index:    func(r reg.GPVirtual) { SHLQ(U8(8), r) },
	dequant: func(v vector, row reg.GPVirtual, acc []reg.VecVirtual, seg int, first bool) {
		for i, a := range acc {
			m := Mem{Base: row, Disp: 2 * v.lanes() * (seg*len(acc) + i)}
			if !first {
				x := v.alloc()
				VCVTPH2PS(m, x)
				VADDPS(x, a, a)
				continue
			}
			VCVTPH2PS(m, a)
			w := v.alloc()
			VPMOVZXWD(m, w)
			VPSLLD(U8(13), w, w) // the half's bit 9 at bit 22
			if v.bytes == 64 {
				k := K()
				VCMPPS(U8(3), a, a, k) // unordered: the NaN lanes
				// a = quietBit ? w : a, in the NaN lanes.
				VPTERNLOGD_BCST(U8(0xd8), quietBit, w, k, a)
				continue
			}
			nan := v.alloc()
			VCMPPS(U8(3), a, a, nan)
			VPXOR(a, w, w)
			VPAND(nan, w, w)
			VPAND(quietBit, w, w)
			VPXOR(w, a, a)
		}
	},
}

// int8 rows are 128 bytes, a float32 scale and a float32 bias.
var int8 = precision{
	name:     "Int8",
	rowBytes: dim + 8,
	index:    func(r reg.GPVirtual) { IMUL3Q(U32(dim+8), r, r) },
	dequant: func(v vector, row reg.GPVirtual, acc []reg.VecVirtual, seg int, first bool) {
		scale, bias := v.alloc(), v.alloc()
		VBROADCASTSS(Mem{Base: row, Disp: dim}, scale)
		VBROADCASTSS(Mem{Base: row, Disp: dim + 4}, bias)
		for i, a := range acc {
			x := target(v, a, first)
			VPMOVZXBD(Mem{Base: row, Disp: v.lanes() * (seg*len(acc) + i)}, x)
			scaleAdd(x, a, scale, bias, first)
		}
	},
}

// int4 rows are 64 bytes of nibbles (element 2i in the low nibble of byte
// i), a half scale and a half bias. AVX-512 looks each element up in a
// table of the row's 16 values (int4Table). AVX2 widens with in-lane
// unpacks only: the 32 bytes of a segment (elements 64s to 64s+63) split
// into their low and high nibbles, which VPUNPCKL/HBW interleave back into
// element order within each 128-bit lane, and two more unpacks with zero
// widen them to dwords. So accumulator j holds elements 4j..4j+3 of the
// segment in its low lane and 32+4j..32+4j+3 in its high one (int4Store
// writes them there). The widenings before, eight VPMOVZXBD that cross
// lanes and their shuffles a row, bound the loop at about 65 cycles a row
// on an AVX2-only AMD EPYC, twice int8's.
var int4 = precision{
	name:     "Int4",
	rowBytes: dim/2 + 4,
	index:    func(r reg.GPVirtual) { IMUL3Q(U32(dim/2+4), r, r) },
	dequant: func(v vector, row reg.GPVirtual, acc []reg.VecVirtual, seg int, first bool) {
		if v.bytes == 64 {
			int4Table(row, acc, first)
			return
		}
		scale, bias := v.alloc(), v.alloc()
		for _, f := range []struct {
			off int
			r   reg.VecVirtual
		}{{dim / 2, scale}, {dim/2 + 2, bias}} {
			h := half(v)
			VPBROADCASTW(Mem{Base: row, Disp: f.off}, h)
			VCVTPH2PS(h, f.r)
		}
		lo, hi := YMM(), YMM()
		VMOVDQU(Mem{Base: row, Disp: 32 * seg}, lo)
		VPSRLW(U8(4), lo, hi)
		VPAND(nibbles, hi, hi)
		VPAND(nibbles, lo, lo)
		// Per lane, bytes 0-7 then 8-15 of the lane's elements.
		bytes := []reg.VecVirtual{YMM(), YMM()}
		VPUNPCKLBW(hi, lo, bytes[0])
		VPUNPCKHBW(hi, lo, bytes[1])
		for i, b := range bytes {
			words := []reg.VecVirtual{YMM(), YMM()}
			VPUNPCKLBW(zeros, b, words[0])
			VPUNPCKHBW(zeros, b, words[1])
			for k, w := range words {
				for d := 0; d < 2; d++ {
					a := acc[4*i+2*k+d]
					x := target(v, a, first)
					if d == 0 {
						VPUNPCKLWD(zeros, w, x)
					} else {
						VPUNPCKHWD(zeros, w, x)
					}
					scaleAdd(x, a, scale, bias, first)
				}
			}
		}
	},
	store: int4Store,
}

// int4Store writes the AVX2 int4 loop's accumulators, whose lanes hold
// elements 32 apart (see int4), each lane where it belongs.
func int4Store(v vector, out reg.Register, acc []reg.VecVirtual, seg int) {
	if v.bytes == 64 {
		// Lanes 2q and 2q+1 hold elements q and 8+q (int4Table).
		idx := ZMM()
		VMOVDQU32(unzip, idx)
		for _, a := range acc {
			VPERMPS(a, idx, a)
		}
		storeInOrder(v, out, acc, seg)
		return
	}
	for j, a := range acc {
		at := 4 * (64*seg + 4*j)
		VMOVUPS(a.AsX(), Mem{Base: out, Disp: at})
		VEXTRACTF128(U8(1), a, Mem{Base: out, Disp: at + 4*32})
	}
}

// storeInOrder writes segment seg's accumulators, which hold its elements
// in order, one after the other.
func storeInOrder(v vector, out reg.Register, acc []reg.VecVirtual, seg int) {
	for i, a := range acc {
		VMOVUPS(a, Mem{Base: out, Disp: (seg*len(acc) + i) * v.bytes})
	}
}

// int4Table is the AVX-512 int4 row: a row has only 16 levels, so it
// computes the 16 values float32(q)·scale + bias once, with the very
// operations scaleAdd uses (so each has scaleAdd's bits, NaN included), in
// one register, and VPERMPS looks each element's value up by its nibble
// (it reads only an index's low four bits, so no mask is needed). The 16
// elements of accumulator g are the 16 nibbles of the row's qword g:
// VPBROADCASTQ puts that qword in every qword lane (a load, no shuffle)
// and VPSRLVQ shifts lane q right by 4q bits, which leaves nibble q at the
// bottom of the lane's low dword and nibble 8+q at the bottom of its high
// one. So accumulator g holds elements 16g+q in lane 2q and 16g+8+q in
// lane 2q+1, and int4Store puts them back in order once a bag. That is one
// permute per 16 elements in place of the widenings, conversion, multiply
// and add of the other loops. The loop had two (a VPERMD to spread the
// row's dwords over the lanes, then the VPERMPS), and on an AMD EPYC Zen 5
// the permutes bound it.
func int4Table(row reg.GPVirtual, acc []reg.VecVirtual, first bool) {
	scale, bias := ZMM(), ZMM()
	for _, f := range []struct {
		off int
		r   reg.VecVirtual
	}{{dim / 2, scale}, {dim/2 + 2, bias}} {
		h := YMM()
		VPBROADCASTW(Mem{Base: row, Disp: f.off}, h)
		VCVTPH2PS(h, f.r)
	}
	table := ZMM()
	VMOVUPS(levels, table)
	VMULPS(scale, table, table)
	VADDPS(bias, table, table)
	shift := ZMM()
	VMOVDQU64(qwordShift, shift)
	for g, a := range acc {
		x := target(avx512, a, first)
		VPBROADCASTQ(Mem{Base: row, Disp: 8 * g}, x)
		VPSRLVQ(shift, x, x)
		VPERMPS(table, x, x)
		if !first {
			VADDPS(x, a, a)
		}
	}
}

// half is the register one broadcast half fills before its widening to
// a register of v: the widening doubles the width.
func half(v vector) reg.VecVirtual {
	if v.bytes == 64 {
		return YMM()
	}
	return XMM()
}

// target is where a dequantized register is built: the accumulator itself
// for a bag's first row, else a temporary.
func target(v vector, acc reg.VecVirtual, first bool) reg.VecVirtual {
	if first {
		return acc
	}
	return v.alloc()
}

// scaleAdd turns the integers in x into float32(q)·scale + bias, the
// product rounded before the sum (no FMA, as model.Dtype requires), and
// adds them to acc unless x is acc. The operand order matches the Go
// kernel's, which decides which NaN comes out when both are NaN.
func scaleAdd(x, acc, scale, bias reg.VecVirtual, first bool) {
	VCVTDQ2PS(x, x)
	VMULPS(scale, x, x)
	VADDPS(bias, x, x)
	if !first {
		VADDPS(x, acc, acc)
	}
}

// pool emits one kernel: a loop per precision (loop) behind a dispatch on
// its prec argument, so Go calls one function per vector flavour. The ids of the batch are one flat stream (example
// by example, bag by bag, in table order); the kernel walks it twice at
// once: the pooling cursor, which sums each bag in registers and stores the
// pooled row once, and a prefetch cursor dist rows ahead, which issues a
// PREFETCHT2 for every cache line of the row it points at. Keeping dist rows
// of misses in flight is what turns a DRAM-latency bound loop into a
// bandwidth bound one; prefetching into L2 rather than L1 keeps them from
// holding the L1 fill buffers the loads need (see DefaultPrefetchRows).
// Rows of a bag are added first to last, the order of the plain-Go kernel,
// so results are bit-identical to it. A kernel whose accumulators hold a
// segment of the row only walks each bag once per segment, prefetching on
// the first walk.
func pool(v vector) {
	name := "pool" + v.name
	TEXT(name, NOSPLIT, "func(out *float32, ids *int32, n int, bases *uintptr, hot *int, ntab int, pos *uintptr, width int, dist int, prec int)")
	Pragma("noescape")
	Doc(
		name+" sum-pools n examples of width ids each into out (n*ntab rows).",
		"bases[t] is table t's first row and hot[t] its bag size (>= 1);",
		"pos[p] is the table base of the id at position p of an example, for",
		"the prefetch cursor. Every id must already be checked against its table.",
		"prec is the tables' precision: its index in model.Dtypes() (0 fp32,",
		"1 fp16, 2 int8, 3 int4); each has a loop of its own.",
	)
	Comment("Dispatch on prec; fp32's loop comes first.")
	prec := Load(Param("prec"), GP64())
	for i, p := range precisions[1:] {
		CMPQ(prec, U8(i+1))
		JE(LabelRef(name + p.name))
	}
	for i, p := range precisions {
		if i > 0 {
			Label(name + p.name)
		}
		loop(name+p.name, v, p)
	}
}

// loop emits the pooling loop of one precision, labelled name.
func loop(name string, v vector, p precision) {
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
		skip := fmt.Sprintf("%s_pfskip%d", name, n)
		CMPQ(pk, end)
		JAE(LabelRef(skip))
		row := GP64()
		MOVLQSX(Mem{Base: pk}, row)
		p.index(row)
		ADDQ(Mem{Base: pos, Index: pp, Scale: 8}, row)
		for off := 0; off < p.rowBytes; off += lineSize {
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
	JLE(LabelRef(name + "_start"))
	Label(name + "_warm")
	prefetch()
	DECQ(warm)
	JNZ(LabelRef(name + "_warm"))

	Label(name + "_start")
	CMPQ(idp, end)
	JAE(LabelRef(name + "_done"))

	regs := v.dequantRegs
	if p.fp32 {
		regs = outBytes / v.bytes
	}
	segs := outBytes / v.bytes / regs
	acc := make([]reg.VecVirtual, regs)
	for i := range acc {
		acc[i] = v.alloc()
	}

	Label(name + "_example")
	t := GP64()
	XORQ(t, t)

	Label(name + "_table")
	h := GP64()
	MOVQ(Mem{Base: hot, Index: t, Scale: 8}, h)
	base := GP64()
	MOVQ(Mem{Base: bases, Index: t, Scale: 8}, base)

	row := GP64()
	// next points row at the bag's next row and advances the cursor.
	next := func() {
		MOVLQSX(Mem{Base: idp}, row)
		p.index(row)
		ADDQ(base, row)
		ADDQ(U8(4), idp)
	}
	for s := 0; s < segs; s++ {
		sfx := ""
		if s > 0 {
			sfx = fmt.Sprint(s)
			Comment(fmt.Sprintf("Segment %d of the row: back to the bag's first id.", s))
			MOVQ(Mem{Base: hot, Index: t, Scale: 8}, h)
			SHLQ(U8(2), h)
			SUBQ(h, idp)
			MOVQ(Mem{Base: hot, Index: t, Scale: 8}, h)
		}
		for _, first := range []bool{true, false} {
			if first {
				Comment("First row of the bag: load.")
			} else {
				Comment("Every further row: add.")
				Label(name + "_bag" + sfx)
			}
			next()
			p.dequant(v, row, acc, s, first)
			if s == 0 {
				prefetch()
			}
			DECQ(h)
			if first {
				JZ(LabelRef(name + "_store" + sfx))
			} else {
				JNZ(LabelRef(name + "_bag" + sfx))
			}
		}

		Label(name + "_store" + sfx)
		if p.store != nil {
			p.store(v, out, acc, s)
		} else {
			storeInOrder(v, out, acc, s)
		}
	}
	ADDQ(U32(outBytes), out)
	INCQ(t)
	CMPQ(t, paramAddr("ntab"))
	JB(LabelRef(name + "_table"))

	CMPQ(idp, end)
	JB(LabelRef(name + "_example"))

	Label(name + "_done")
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
