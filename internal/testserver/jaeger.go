package testserver

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// JaegerEnv names the environment variable that gives a prebuilt jaeger binary (Jaeger v2,
// built from tools/jaeger) instead of building one.
const JaegerEnv = "GUARD_JAEGER"

// jaegerHint tells how to get the Jaeger binary when it cannot be built.
const jaegerHint = "build it by hand to see why: cd tools/jaeger && go build -o jaeger " +
	"github.com/jaegertracing/jaeger/cmd/jaeger (about 3 minutes to download, more to compile; " +
	"it needs the Go module proxy, or a module cache that holds Jaeger v1.76.0); " +
	"then set " + JaegerEnv + "=$PWD/jaeger. A cold build can outlast go test's default " +
	"-timeout: build it once first, or keep the user cache directory (guard-tools/) between CI runs"

// Jaeger is a Jaeger v2 all-in-one with in-memory storage, run as a child process of the test
// on free loopback ports, with nothing but an OTLP/HTTP receiver and the query service.
type Jaeger struct {
	// OTLPEndpoint is the host:port of the OTLP/HTTP receiver (the otlptracehttp exporter's
	// WithEndpoint; plain HTTP).
	OTLPEndpoint string
	// QueryURL is the base URL of the query service: its HTTP API and the UI, when the UI's
	// assets are built in (they are not, from the module proxy).
	QueryURL string

	proc   *Process
	client *http.Client // its idle connections are closed when the test ends
}

// jaegerConfig is the collector configuration: one receiver, one storage, the query
// extension, every endpoint on a port chosen by the test (nothing else listens: no metrics,
// health or sampling endpoints). Tracing of the query service itself is off: it would report
// to an exporter that does not exist and slow the shutdown. The spans come from one host, so
// clock skew adjustment is off too: the test sees the timestamps it exported.
const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
  jaeger_query:
    enable_tracing: false
    max_clock_skew_adjust: 0s
    storage:
      traces: memstore
    http:
      endpoint: %[1]s
    grpc:
      endpoint: %[2]s
receivers:
  otlp:
    protocols:
      http:
        endpoint: %[3]s
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// StartJaeger starts Jaeger (built from tools/jaeger once, then cached outside the repository)
// on free loopback ports and waits until it takes spans and answers queries. It stops when
// the test ends. It fails the test, saying how to get Jaeger, when it cannot be built.
func StartJaeger(tb testing.TB) *Jaeger {
	tb.Helper()
	bin := jaeger.binary(tb)
	port := func() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(tb))) }
	query, queryGRPC, otlp := port(), port(), port()
	config := filepath.Join(tb.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, jaegerConfig, query, queryGRPC, otlp), 0o644); err != nil {
		tb.Fatalf("testserver: %v", err)
	}
	// The receiver starts after the extensions: once it listens, the query service does too.
	proc := Start(tb, otlp, jaegerHint, bin, "--config=file:"+config)
	j := &Jaeger{OTLPEndpoint: otlp, QueryURL: "http://" + query, proc: proc, client: &http.Client{}}
	tb.Cleanup(j.client.CloseIdleConnections)

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := j.waitReady(ctx); err != nil {
		tb.Fatalf("testserver: jaeger: %v\n%s", err, proc.Output())
	}
	return j
}

// Output is what Jaeger printed so far.
func (j *Jaeger) Output() string { return j.proc.Output() }

// waitReady waits until the query service answers.
func (j *Jaeger) waitReady(ctx context.Context) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.QueryURL+"/api/v3/services", nil)
		if err != nil {
			return err
		}
		resp, err := j.client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("query service not ready: %v", err)
		case <-tick.C:
		}
	}
}

// Span is a span as Jaeger's query API returns it, reduced to what tests look at.
type Span struct {
	Service      string // the service.name of its resource
	TraceID      string // hex
	SpanID       string // hex
	ParentSpanID string // hex; "" for a root
	Name         string
	Start, End   time.Time
	// Attributes holds string, int64, float64 and bool values by key.
	Attributes map[string]any
	Events     []string // event names, in order
	// Status is "error", "ok" or "" (unset); StatusMessage its description.
	Status        string
	StatusMessage string
}

// Spans returns the spans of the traces of service that started between since and now, as
// Jaeger has stored them so far (spans show up a few hundred milliseconds after export). It
// asks for up to 1000 traces. No trace is not an error.
func (j *Jaeger) Spans(ctx context.Context, service string, since time.Time) ([]Span, error) {
	q := url.Values{}
	q.Set("query.service_name", service)
	q.Set("query.start_time_min", since.UTC().Format(time.RFC3339Nano))
	q.Set("query.start_time_max", time.Now().Add(time.Minute).UTC().Format(time.RFC3339Nano))
	q.Set("query.num_traces", "1000")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.QueryURL+"/api/v3/traces?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := j.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("jaeger: query traces: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("jaeger: query traces: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound: // "No traces found"
		return nil, nil
	default:
		return nil, fmt.Errorf("jaeger: query traces: %s: %s", resp.Status, body)
	}
	return decodeTraces(body)
}

// WaitSpans asks Jaeger for the spans of service since since until done accepts them or ctx
// ends, and returns the last answer. Spans reach the query service a little while after the
// exporter sent them.
func (j *Jaeger) WaitSpans(ctx context.Context, service string, since time.Time, done func([]Span) bool) ([]Span, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		spans, err := j.Spans(ctx, service, since)
		if err == nil && done(spans) {
			return spans, nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return spans, fmt.Errorf("jaeger: waiting for the spans of %q: %w", service, err)
		case <-tick.C:
		}
	}
}

// tracesResponse is the part of the answer of /api/v3/traces that Span needs: OTLP's JSON
// encoding (camelCase names, 64-bit integers as strings) inside a "result" wrapper.
type tracesResponse struct {
	Result struct {
		ResourceSpans []struct {
			Resource struct {
				Attributes []otlpAttribute `json:"attributes"`
			} `json:"resource"`
			ScopeSpans []struct {
				Spans []struct {
					TraceID           string          `json:"traceId"`
					SpanID            string          `json:"spanId"`
					ParentSpanID      string          `json:"parentSpanId"`
					Name              string          `json:"name"`
					StartTimeUnixNano json.Number     `json:"startTimeUnixNano"`
					EndTimeUnixNano   json.Number     `json:"endTimeUnixNano"`
					Attributes        []otlpAttribute `json:"attributes"`
					Events            []struct {
						Name string `json:"name"`
					} `json:"events"`
					Status struct {
						Code    json.RawMessage `json:"code"` // 2, or "STATUS_CODE_ERROR"
						Message string          `json:"message"`
					} `json:"status"`
				} `json:"spans"`
			} `json:"scopeSpans"`
		} `json:"resourceSpans"`
	} `json:"result"`
}

type otlpAttribute struct {
	Key   string `json:"key"`
	Value struct {
		StringValue *string      `json:"stringValue"`
		IntValue    *json.Number `json:"intValue"`
		DoubleValue *float64     `json:"doubleValue"`
		BoolValue   *bool        `json:"boolValue"`
	} `json:"value"`
}

func (a otlpAttribute) value() any {
	v := a.Value
	switch {
	case v.StringValue != nil:
		return *v.StringValue
	case v.IntValue != nil:
		n, _ := v.IntValue.Int64()
		return n
	case v.DoubleValue != nil:
		return *v.DoubleValue
	case v.BoolValue != nil:
		return *v.BoolValue
	}
	return nil
}

func decodeTraces(body []byte) ([]Span, error) {
	var r tracesResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("jaeger: decode traces: %w", err)
	}
	var spans []Span
	for _, rs := range r.Result.ResourceSpans {
		service := ""
		for _, a := range rs.Resource.Attributes {
			if a.Key == "service.name" {
				service, _ = a.value().(string)
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				sp := Span{
					Service:       service,
					TraceID:       hexID(s.TraceID),
					SpanID:        hexID(s.SpanID),
					ParentSpanID:  hexID(s.ParentSpanID),
					Name:          s.Name,
					Start:         unixNano(s.StartTimeUnixNano),
					End:           unixNano(s.EndTimeUnixNano),
					Attributes:    make(map[string]any, len(s.Attributes)),
					Status:        statusName(s.Status.Code),
					StatusMessage: s.Status.Message,
				}
				for _, a := range s.Attributes {
					sp.Attributes[a.Key] = a.value()
				}
				for _, e := range s.Events {
					sp.Events = append(sp.Events, e.Name)
				}
				spans = append(spans, sp)
			}
		}
	}
	return spans, nil
}

// hexID returns a trace or span ID in hex. OTLP's JSON encoding writes IDs in hex; a protobuf
// JSON encoder that does not know the OTLP rule writes bytes in base64, which this also reads.
func hexID(id string) string {
	if id == "" {
		return ""
	}
	if _, err := hex.DecodeString(id); err == nil && (len(id) == 16 || len(id) == 32) {
		return strings.ToLower(id)
	}
	if b, err := base64.StdEncoding.DecodeString(id); err == nil {
		return hex.EncodeToString(b)
	}
	return id
}

// statusName returns a status code, which Jaeger writes as a number and a protobuf JSON
// encoder may write as an enum name, as Span.Status has it.
func statusName(code json.RawMessage) string {
	switch strings.Trim(string(code), `"`) {
	case "1", "STATUS_CODE_OK":
		return "ok"
	case "2", "STATUS_CODE_ERROR":
		return "error"
	}
	return ""
}

func unixNano(n json.Number) time.Time {
	v, err := n.Int64()
	if err != nil || v == 0 {
		return time.Time{}
	}
	return time.Unix(0, v)
}

// jaeger is the Jaeger all-in-one of tools/jaeger.
var jaeger = &tool{
	name:    "jaeger",
	pkg:     "github.com/jaegertracing/jaeger/cmd/jaeger",
	sources: []string{"go.mod", "go.sum"},
	env:     JaegerEnv,
	hint:    jaegerHint,
	timeout: 30 * time.Minute,
}
