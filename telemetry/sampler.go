package telemetry

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// samplerFromEnv builds the sampler OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG name (the SDK's own values; default
// parentbased_always_on) and wraps it in linkedSampler. An unknown name or a
// bad ratio is an error naming the variable, not a silent fallback.
func samplerFromEnv() (sdktrace.Sampler, error) {
	name := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER")))
	arg := strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER_ARG"))
	ratio := func() (float64, error) {
		if arg == "" {
			return 1, nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return 0, fmt.Errorf("telemetry: OTEL_TRACES_SAMPLER_ARG=%q: want a ratio between 0 and 1", arg)
		}
		return r, nil
	}
	var base sdktrace.Sampler
	switch name {
	case "", "parentbased_always_on":
		base = sdktrace.ParentBased(sdktrace.AlwaysSample())
	case "parentbased_always_off":
		base = sdktrace.ParentBased(sdktrace.NeverSample())
	case "always_on":
		base = sdktrace.AlwaysSample()
	case "always_off":
		base = sdktrace.NeverSample()
	case "traceidratio", "parentbased_traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, err
		}
		base = sdktrace.TraceIDRatioBased(r)
		if name == "parentbased_traceidratio" {
			base = sdktrace.ParentBased(base)
		}
	default:
		return nil, fmt.Errorf("telemetry: OTEL_TRACES_SAMPLER=%q: want always_on, always_off, traceidratio or their parentbased_ forms", name)
	}
	return linkedSampler{base: base}, nil
}

// linkedSampler samples every span that links to a sampled span, and
// leaves the rest to base. A batch span (the embedder's lookup, the
// accelerator's execute) is a root span linking the requests it carries: a
// ratio sampler alone would keep it with the ratio's probability, so a
// sampled request's trace would mostly lack the batch that served it.
type linkedSampler struct{ base sdktrace.Sampler }

func (s linkedSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	for _, l := range p.Links {
		if l.SpanContext.IsSampled() {
			return sdktrace.SamplingResult{
				Decision:   sdktrace.RecordAndSample,
				Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState(),
			}
		}
	}
	return s.base.ShouldSample(p)
}

func (s linkedSampler) Description() string {
	return "LinkedSampler{" + s.base.Description() + "}"
}
