package embedder

import (
	"errors"
	"testing"
	"time"
)

// TestOptionsValidate: every range the embedder relies on is refused at
// New, naming the field.
func TestOptionsValidate(t *testing.T) {
	base := Options{Bundle: "b"}
	for _, tc := range []struct {
		option string
		edit   func(*Options)
	}{
		{"Bundle", func(o *Options) { o.Bundle = "" }},
		{"Lanes", func(o *Options) { o.Lanes = MaxLanes + 1 }},
		{"LanesPerFrontend", func(o *Options) { o.Lanes, o.LanesPerFrontend = 4, 5 }},
		{"MaxBatch", func(o *Options) { o.MaxBatch = 1 << 17 }},
		{"Window", func(o *Options) { o.Window = -time.Millisecond }},
		{"LatencyTarget", func(o *Options) { o.LatencyTarget = time.Microsecond }},
		{"SLOBatchBytes", func(o *Options) { o.SLOBatchBytes = MaxSLOBatchBytes + 1 }},
	} {
		o := base
		tc.edit(&o)
		_, err := New(o)
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Option != tc.option {
			t.Errorf("%s: New = %v, want an OptionError naming it", tc.option, err)
		}
	}
	if err := base.withDefaults().validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
}
