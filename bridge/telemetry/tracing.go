package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/buildinfo"
)

// Instrumentation is the tracer's instrumentation scope.
const Instrumentation = "github.com/bridgecdc/bridge"

// Header names of the W3C trace context, lowercase as the specification
// writes them (NATS headers are case-sensitive).
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// Plan is what the configuration and the environment ask of tracing.
type Plan struct {
	Enabled  bool
	Protocol string // "grpc" or "http/protobuf"
	Endpoint string // from bridge.yaml; "" leaves it to OTEL_* and the exporter
	Sampler  sdktrace.Sampler
	Why      string // why tracing is on or off, for the log
}

// PlanTracing decides, from cfg and the environment (getenv), whether to
// trace and how. OTEL_* variables win over bridge.yaml when set.
func PlanTracing(cfg config.Tracing, getenv func(string) string) (Plan, error) {
	env := func(k string) string { return strings.TrimSpace(getenv(k)) }
	var p Plan
	exporter := strings.ToLower(env("OTEL_TRACES_EXPORTER"))
	switch exporter {
	case "", "otlp", "none":
	default:
		return p, fmt.Errorf("OTEL_TRACES_EXPORTER=%q is not supported (otlp or none)", exporter)
	}
	envEndpoint := env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || env("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
	switch {
	case strings.EqualFold(env("OTEL_SDK_DISABLED"), "true"):
		p.Why = "OTEL_SDK_DISABLED=true"
	case exporter == "none":
		p.Why = "OTEL_TRACES_EXPORTER=none"
	case cfg.Enabled != nil:
		p.Enabled = *cfg.Enabled
		p.Why = "telemetry.tracing.enabled"
	case cfg.Endpoint != "":
		p.Enabled, p.Why = true, "telemetry.tracing.endpoint is set"
	case envEndpoint:
		p.Enabled, p.Why = true, "OTEL_EXPORTER_OTLP_ENDPOINT is set"
	case exporter == "otlp":
		p.Enabled, p.Why = true, "OTEL_TRACES_EXPORTER=otlp"
	default:
		p.Why = "no exporter endpoint configured"
	}
	if !p.Enabled {
		return p, nil
	}
	p.Protocol = firstNonEmpty(env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), env("OTEL_EXPORTER_OTLP_PROTOCOL"), cfg.Protocol, "http/protobuf")
	if p.Protocol != "grpc" && p.Protocol != "http/protobuf" {
		return p, fmt.Errorf("OTLP protocol %q is not supported (grpc or http/protobuf)", p.Protocol)
	}
	if !envEndpoint {
		p.Endpoint = cfg.Endpoint
	}
	if env("OTEL_TRACES_SAMPLER") == "" {
		p.Sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))
	}
	return p, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// Validate checks the telemetry and http sections; errors name their YAML
// path.
func Validate(cfg *config.Config) []error {
	var errs []error
	tr := cfg.Telemetry.Tracing
	if tr.Endpoint != "" {
		if _, err := endpointURL(tr.Endpoint); err != nil {
			errs = append(errs, &config.FieldError{Path: "telemetry.tracing.endpoint", Msg: err.Error()})
		}
	}
	if tr.Protocol != "grpc" && tr.Protocol != "http/protobuf" {
		errs = append(errs, &config.FieldError{Path: "telemetry.tracing.protocol", Msg: fmt.Sprintf("must be grpc or http/protobuf, got %q", tr.Protocol)})
	}
	if tr.SampleRatio < 0 || tr.SampleRatio > 1 {
		errs = append(errs, &config.FieldError{Path: "telemetry.tracing.sample_ratio", Msg: fmt.Sprintf("must be between 0 and 1, got %g", tr.SampleRatio)})
	}
	if cfg.Telemetry.Metrics.SlotPollInterval <= 0 {
		errs = append(errs, &config.FieldError{Path: "telemetry.metrics.slot_poll_interval", Msg: fmt.Sprintf("must be > 0, got %s", cfg.Telemetry.Metrics.SlotPollInterval)})
	}
	if cfg.HTTP.MaxCheckpointAge <= 0 {
		errs = append(errs, &config.FieldError{Path: "http.max_checkpoint_age", Msg: fmt.Sprintf("must be > 0, got %s", cfg.HTTP.MaxCheckpointAge)})
	}
	return errs
}

// endpointURL parses a collector base URL.
func endpointURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("must be an http:// or https:// URL such as http://collector:4318, got %q", config.Redact(s))
	}
	if u.User != nil {
		return nil, fmt.Errorf("must not hold credentials (%q); pass them in OTEL_EXPORTER_OTLP_HEADERS, e.g. authorization=Basic ...", config.Redact(s))
	}
	return u, nil
}

// NewTracerProvider builds the SDK provider the plan asks for. It does no
// network I/O: exporters connect on their first export.
func NewTracerProvider(ctx context.Context, p Plan, bridgeName string) (*sdktrace.TracerProvider, error) {
	var client otlptrace.Client
	var u *url.URL
	if p.Endpoint != "" {
		var err error
		if u, err = endpointURL(p.Endpoint); err != nil {
			return nil, err
		}
	}
	if p.Protocol == "grpc" {
		var opts []otlptracegrpc.Option
		if u != nil {
			opts = append(opts, otlptracegrpc.WithEndpoint(u.Host))
			if u.Scheme == "http" {
				opts = append(opts, otlptracegrpc.WithInsecure())
			}
		}
		client = otlptracegrpc.NewClient(opts...)
	} else {
		var opts []otlptracehttp.Option
		if u != nil {
			// Like OTEL_EXPORTER_OTLP_ENDPOINT: a base URL.
			opts = append(opts, otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithURLPath(strings.TrimSuffix(u.Path, "/")+"/v1/traces"))
			if u.Scheme == "http" {
				opts = append(opts, otlptracehttp.WithInsecure())
			}
		}
		client = otlptracehttp.NewClient(opts...)
	}
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, fmt.Errorf("creating OTLP %s trace exporter: %w", p.Protocol, err)
	}
	// service.name defaults to "bridge"; OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES win.
	base := resource.NewSchemaless(attribute.String("service.name", "bridge"), attribute.String("bridge.name", bridgeName),
		attribute.String("service.version", buildinfo.String()))
	fromEnv, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("reading OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	res, err := resource.Merge(base, fromEnv)
	if err != nil {
		return nil, fmt.Errorf("building the trace resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
	if p.Sampler != nil {
		opts = append(opts, sdktrace.WithSampler(p.Sampler))
	}
	return sdktrace.NewTracerProvider(opts...), nil
}
