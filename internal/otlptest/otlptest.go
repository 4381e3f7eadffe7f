// Package otlptest is an in-process OTLP trace receiver (HTTP/protobuf and
// gRPC) for tests.
package otlptest

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is a span an Receiver got.
type Span struct {
	Service                   string
	Name                      string
	Kind                      string
	TraceID, SpanID, Parent   string // hex; Parent "" for a root span
	Attrs                     map[string]string
	StatusCode, StatusMessage string
}

// Receiver collects the spans exported to it.
type Receiver struct {
	// HTTPURL is the base URL of the OTLP/HTTP endpoint (POST /v1/traces).
	HTTPURL string
	// GRPCURL is the base URL of the OTLP/gRPC endpoint.
	GRPCURL string

	// Discard makes the receiver count spans instead of keeping them.
	Discard bool

	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []Span
	count int
}

// NewReceiver starts a receiver, stopped in t's cleanup.
func NewReceiver(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
			http.NotFound(w, req)
			return
		}
		b, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var in coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.add(&in)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(hs.Close)
	r.HTTPURL = hs.URL

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, r)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	r.GRPCURL = "http://" + ln.Addr().String()
	return r
}

// Export implements the OTLP/gRPC trace service.
func (r *Receiver) Export(_ context.Context, in *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.add(in)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) add(in *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Discard {
		for _, rs := range in.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				r.count += len(ss.GetSpans())
			}
		}
		return
	}
	for _, rs := range in.GetResourceSpans() {
		service := attrs(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, Span{
					Service: service, Name: s.GetName(), Kind: s.GetKind().String(),
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					Parent: hex.EncodeToString(s.GetParentSpanId()), Attrs: attrs(s.GetAttributes()),
					StatusCode: s.GetStatus().GetCode().String(), StatusMessage: s.GetStatus().GetMessage(),
				})
			}
		}
	}
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		v := kv.GetValue()
		switch v.GetValue().(type) {
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(v.GetIntValue(), 10)
		case *commonpb.AnyValue_BoolValue:
			if v.GetBoolValue() {
				m[kv.GetKey()] = "true"
			} else {
				m[kv.GetKey()] = "false"
			}
		default:
			m[kv.GetKey()] = v.GetStringValue()
		}
	}
	return m
}

// Spans returns what the receiver got so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}
