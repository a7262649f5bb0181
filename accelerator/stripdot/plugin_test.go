package stripdot_test

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"unsafe"

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

// call is a program that only calls target, with the shapes given.
func call(target string, m, k, strips, outStrips int) string {
	return fmt.Sprintf(`module @strip {
  func.func @main(%%x: tensor<%dx%dxf32>, %%w: tensor<%dx%dx32xf32>) -> tensor<%dx%dx32xf32> {
    %%0 = "stablehlo.custom_call"(%%x, %%w) {api_version = 4 : i32, call_target_name = "%s"} : (tensor<%dx%dxf32>, tensor<%dx%dx32xf32>) -> tensor<%dx%dx32xf32>
    "func.return"(%%0) : (tensor<%dx%dx32xf32>) -> ()
  }
}`, m, k, strips, k, m, outStrips, target, m, k, strips, k, m, outStrips, m, outStrips)
}

// TestHandlerThroughThePlugin runs the custom call in a program compiled
// by the plugin and compares it with the plain Go reference, with each
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
			handlerThroughThePlugin(t, rt, target)
		})
	}
}

func handlerThroughThePlugin(t *testing.T, rt *device.Runtime, target string) {
	const m, k, n = 3, 40, 96
	exe, err := rt.Client.Compile().WithStableHLO([]byte(call(target, m, k, n/stripdot.Width, n/stripdot.Width))).Done()
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Destroy()
	x, w := make([]float32, m*k), make([]float32, k*n)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	for i := range w {
		w[i] = float32(i%11)/8 - 0.5
	}
	packed := make([]float32, k*n)
	if err := stripdot.Pack(packed, w, k, n); err != nil {
		t.Fatal(err)
	}
	xb, err := rt.Client.BufferFromHost().FromFlatDataWithDimensions(x, []int{m, k}).Done()
	if err != nil {
		t.Fatal(err)
	}
	defer xb.Destroy()
	wb, err := rt.Client.BufferFromHost().FromFlatDataWithDimensions(packed, stripdot.PackedShape(k, n)).Done()
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
	want := make([]float32, m*n)
	if err := stripdot.Reference(x, m, k, packed, n, want); err != nil {
		t.Fatal(err)
	}
	for i := range want {
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
	exe, err := rt.Client.Compile().WithStableHLO([]byte(call(stripdot.Target, m, k, 2, 1))).Done()
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
