package stripdot_test

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"unsafe"

	"github.com/gomlx/gopjrt/dtypes"

	"github.com/recmesh/recmesh/accelerator/device"
	"github.com/recmesh/recmesh/accelerator/stripdot"
)

// openPlugin loads the CPU plugin and registers the handler with it.
func openPlugin(t *testing.T) *device.Runtime {
	t.Helper()
	if !stripdot.Supported() {
		t.Skip(stripdot.ErrUnsupported)
	}
	if _, err := device.FindPlugin(""); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs the PJRT plugin: %v", err)
		}
		t.Skipf("no PJRT plugin (run make deps): %v", err)
	}
	rt, err := device.Open("", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	if err := stripdot.Register(rt.Plugin.Path()); err != nil {
		t.Fatal(err)
	}
	return rt
}

// call is a program that only calls target, with the shapes given and
// weights of type elem ("f32", "f16", ...).
func call(target string, m, k, strips, outStrips int, elem string) string {
	return fmt.Sprintf(`module @strip {
  func.func @main(%%x: tensor<%dx%dxf32>, %%w: tensor<%dx%dx32x%s>) -> tensor<%dx%dx32xf32> {
    %%0 = "stablehlo.custom_call"(%%x, %%w) {api_version = 4 : i32, call_target_name = "%s"} : (tensor<%dx%dxf32>, tensor<%dx%dx32x%s>) -> tensor<%dx%dx32xf32>
    "func.return"(%%0) : (tensor<%dx%dx32xf32>) -> ()
  }
}`, m, k, strips, k, elem, m, outStrips, target, m, k, strips, k, elem, m, outStrips, m, outStrips)
}

// TestHandlerThroughThePlugin runs the custom call in a program compiled
// by the plugin over f32, f16 and bf16 weights and compares it with the
// plain Go reference and with Multiply over the widened weights, with each
// kernel this CPU runs: Target with the one Register chose, the others
// under names of their own.
func TestHandlerThroughThePlugin(t *testing.T) {
	rt := openPlugin(t)
	for _, name := range stripdot.KernelNames() {
		t.Run(name, func(t *testing.T) {
			target := stripdot.Target
			if name != stripdot.Kernel() {
				target += "_" + name
				if err := stripdot.RegisterKernel(rt.Plugin.Path(), target, name); err != nil {
					t.Fatal(err)
				}
			}
			for _, elem := range []stripdot.Element{stripdot.Float32, stripdot.Float16, stripdot.BFloat16} {
				t.Run(elem.String(), func(t *testing.T) { handlerThroughThePlugin(t, rt, target, elem) })
			}
		})
	}
}

func handlerThroughThePlugin(t *testing.T, rt *device.Runtime, target string, elem stripdot.Element) {
	const m, k, n = 3, 40, 96
	exe, err := rt.Client.Compile().WithStableHLO([]byte(call(target, m, k, n/stripdot.Width, n/stripdot.Width, elem.String()))).Done()
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Destroy()
	x := make([]float32, m*k)
	for i := range x {
		x[i] = float32(i%7) - 3 + float32(i%5)/16
	}
	// Weights of every sign and of a few binades, with mantissas that make
	// the products round; the f32 weights are the fp16 ones widened.
	half := elem
	if elem == stripdot.Float32 {
		half = stripdot.Float16
	}
	w16 := make([]uint16, k*n)
	for i := range w16 {
		sign := uint16(i&1) << 15
		if half == stripdot.BFloat16 {
			w16[i] = sign | uint16(122+i%5)<<7 | uint16(i*37%128)
		} else {
			w16[i] = sign | uint16(10+i%5)<<10 | uint16(i*37%1024)
		}
	}
	w := make([]float32, k*n)
	if err := stripdot.Widen(w, w16, half); err != nil {
		t.Fatal(err)
	}
	packed, packed16 := make([]float32, k*n), make([]uint16, k*n)
	if err := stripdot.Pack(packed, w, k, n); err != nil {
		t.Fatal(err)
	}
	if err := stripdot.Pack16(packed16, w16, k, n); err != nil {
		t.Fatal(err)
	}
	xb, err := rt.Client.BufferFromHost().FromFlatDataWithDimensions(x, []int{m, k}).Done()
	if err != nil {
		t.Fatal(err)
	}
	defer xb.Destroy()
	wc := rt.Client.BufferFromHost()
	raw16 := unsafe.Slice((*byte)(unsafe.Pointer(&packed16[0])), 2*k*n)
	switch elem {
	case stripdot.Float32:
		wc = wc.FromFlatDataWithDimensions(packed, stripdot.PackedShape(k, n))
	case stripdot.Float16:
		wc = wc.FromRawData(raw16, dtypes.Float16, stripdot.PackedShape(k, n))
	case stripdot.BFloat16:
		wc = wc.FromRawData(raw16, dtypes.BFloat16, stripdot.PackedShape(k, n))
	}
	wb, err := wc.Done()
	if err != nil {
		t.Fatal(err)
	}
	defer wb.Destroy()
	outs, err := exe.Execute(xb, wb).DonateNone().Done()
	if err != nil {
		t.Fatal(err)
	}
	defer outs[0].Destroy()
	raw := make([]byte, m*n*4)
	if err := outs[0].ToHost(raw); err != nil {
		t.Fatal(err)
	}
	got := unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), m*n)
	want, exact := make([]float32, m*n), make([]float32, m*n)
	if err := stripdot.Reference(x, m, k, packed, n, want); err != nil {
		t.Fatal(err)
	}
	if elem != stripdot.Float32 {
		// The same values, through the half path of the reference.
		if err := stripdot.ReferenceHalf(x, m, k, packed16, elem, n, want); err != nil {
			t.Fatal(err)
		}
	}
	// Every kernel gives the same bits, and a half kernel those of the
	// float32 one over the widened weights.
	if err := stripdot.Multiply(x, m, k, packed, n, exact); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(exact[i]) {
			t.Fatalf("out[%d] = %v through the plugin, Multiply over the widened weights %v", i, got[i], exact[i])
		}
		if math.Abs(float64(got[i]-want[i])) > 1e-4 {
			t.Fatalf("out[%d] = %v through the plugin, reference %v", i, got[i], want[i])
		}
	}
}

// TestHandlerRejectsMismatchedShapes gives the call a result with fewer
// strips than its weights: the run must fail with the handler's message,
// not write past the result.
func TestHandlerRejectsMismatchedShapes(t *testing.T) {
	rt := openPlugin(t)
	const m, k = 2, 8
	exe, err := rt.Client.Compile().WithStableHLO([]byte(call(stripdot.Target, m, k, 2, 1, "f32"))).Done()
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Destroy()
	xb, err := rt.Client.BufferFromHost().FromFlatDataWithDimensions(make([]float32, m*k), []int{m, k}).Done()
	if err != nil {
		t.Fatal(err)
	}
	defer xb.Destroy()
	wb, err := rt.Client.BufferFromHost().FromFlatDataWithDimensions(make([]float32, 2*k*32), []int{2, k, 32}).Done()
	if err != nil {
		t.Fatal(err)
	}
	defer wb.Destroy()
	outs, err := exe.Execute(xb, wb).DonateNone().Done()
	for _, o := range outs {
		o.Destroy()
	}
	if err == nil || !strings.Contains(err.Error(), "recmesh strip dot") {
		t.Fatalf("mismatched shapes: err = %v, want the handler's error", err)
	}
}

// TestHandlerRejectsOtherElementTypes gives the call f64 weights: the run
// must fail with the handler's message, not read them as another type.
func TestHandlerRejectsOtherElementTypes(t *testing.T) {
	rt := openPlugin(t)
	const m, k = 2, 8
	exe, err := rt.Client.Compile().WithStableHLO([]byte(call(stripdot.Target, m, k, 1, 1, "f64"))).Done()
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Destroy()
	xb, err := rt.Client.BufferFromHost().FromFlatDataWithDimensions(make([]float32, m*k), []int{m, k}).Done()
	if err != nil {
		t.Fatal(err)
	}
	defer xb.Destroy()
	wb, err := rt.Client.BufferFromHost().FromFlatDataWithDimensions(make([]float64, k*32), []int{1, k, 32}).Done()
	if err != nil {
		t.Fatal(err)
	}
	defer wb.Destroy()
	outs, err := exe.Execute(xb, wb).DonateNone().Done()
	for _, o := range outs {
		o.Destroy()
	}
	if err == nil || !strings.Contains(err.Error(), "f32, f16 or bf16") {
		t.Fatalf("f64 weights: err = %v, want the handler's error", err)
	}
}
