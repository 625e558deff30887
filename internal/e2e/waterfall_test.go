package e2e

import (
	"encoding/xml"
	"fmt"
	"html"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/tracing"
)

// docsEnv names a directory: when set, the end-to-end test draws the traces it read back
// from Jaeger as img/jaeger-waterfall.svg there. docs/tracing.md shows the command.
const docsEnv = "GUARD_DOCS_DIR"

// waterfall draws the traces of spans as an SVG waterfall, one row per span, the way
// Jaeger's trace view lays them out: children under their parent, bars on a shared time axis.
// It draws at most maxTraces traces, those whose requests waited longest for their lock.
func waterfall(w io.Writer, spans []testserver.Span, maxTraces int) error {
	byTrace := map[string][]testserver.Span{}
	waited := map[string]float64{}
	for _, s := range spans {
		byTrace[s.TraceID] = append(byTrace[s.TraceID], s)
		if v, ok := s.Attributes[string(tracing.WaitKey)].(float64); ok && v > waited[s.TraceID] {
			waited[s.TraceID] = v
		}
	}
	var traces []string
	for id := range byTrace {
		traces = append(traces, id)
	}
	sort.Slice(traces, func(i, j int) bool { return earliest(byTrace[traces[i]]).Before(earliest(byTrace[traces[j]])) })
	if len(traces) > maxTraces {
		// Keep the traces that waited longest, in time order.
		chosen := append([]string(nil), traces...)
		sort.SliceStable(chosen, func(i, j int) bool { return waited[chosen[i]] > waited[chosen[j]] })
		keep := map[string]bool{}
		for _, id := range chosen[:maxTraces] {
			keep[id] = true
		}
		traces = traces[:0]
		for id := range byTrace {
			if keep[id] {
				traces = append(traces, id)
			}
		}
		sort.Slice(traces, func(i, j int) bool { return earliest(byTrace[traces[i]]).Before(earliest(byTrace[traces[j]])) })
	}

	type row struct {
		span  testserver.Span
		depth int
	}
	var rows []row
	var t0, t1 time.Time
	for _, id := range traces {
		ss := byTrace[id]
		children := map[string][]testserver.Span{}
		ids := map[string]bool{}
		for _, s := range ss {
			ids[s.SpanID] = true
		}
		var roots []testserver.Span
		for _, s := range ss {
			if s.ParentSpanID == "" || !ids[s.ParentSpanID] {
				roots = append(roots, s)
			} else {
				children[s.ParentSpanID] = append(children[s.ParentSpanID], s)
			}
		}
		var walk func(s testserver.Span, depth int)
		walk = func(s testserver.Span, depth int) {
			rows = append(rows, row{s, depth})
			if t0.IsZero() || s.Start.Before(t0) {
				t0 = s.Start
			}
			if s.End.After(t1) {
				t1 = s.End
			}
			kids := children[s.SpanID]
			sort.Slice(kids, func(i, j int) bool { return kids[i].Start.Before(kids[j].Start) })
			for _, k := range kids {
				walk(k, depth+1)
			}
		}
		sort.Slice(roots, func(i, j int) bool { return roots[i].Start.Before(roots[j].Start) })
		for _, r := range roots {
			walk(r, 0)
		}
	}
	if len(rows) == 0 {
		return fmt.Errorf("no spans to draw")
	}

	const (
		labelW = 640
		barW   = 560
		rowH   = 22
		top    = 70
		left   = 12
	)
	total := t1.Sub(t0)
	if total <= 0 {
		total = time.Millisecond
	}
	x := func(t time.Time) float64 { return left + labelW + float64(t.Sub(t0))/float64(total)*barW }
	height := top + len(rows)*rowH + 40
	width := left + labelW + barW + 30

	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	p(`<text x="%d" y="24" font-size="16" font-weight="bold">Lock waits as Jaeger stored them: concurrent withdrawals on one account</text>`+"\n", left)
	p(`<text x="%d" y="44" fill="#555">%d traces, %d spans, read back from Jaeger's query API by the end-to-end test; time axis %v</text>`+"\n", left, len(traces), len(rows), total.Round(time.Microsecond))
	// Time grid.
	for i := 0; i <= 4; i++ {
		gx := left + labelW + float64(i)*barW/4
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e4e4e4"/>`+"\n", gx, top-8, gx, top+len(rows)*rowH)
		p(`<text x="%.1f" y="%d" fill="#777" text-anchor="middle">%v</text>`+"\n", gx, top-12, (total * time.Duration(i) / 4).Round(time.Microsecond*100))
	}
	for i, r := range rows {
		y := top + i*rowH
		if i%2 == 1 {
			p(`<rect x="%d" y="%d" width="%d" height="%d" fill="#f7f7f7"/>`+"\n", left, y, labelW+barW+10, rowH)
		}
		color, note := style(r.span, r.depth == 0)
		label := r.span.Name
		if note != "" {
			label += "  " + note
		}
		p(`<text x="%d" y="%d" fill="#222">%s</text>`+"\n", left+r.depth*16, y+15, html.EscapeString(label))
		bx, ex := x(r.span.Start), x(r.span.End)
		if ex-bx < 1.5 {
			ex = bx + 1.5
		}
		p(`<rect x="%.1f" y="%d" width="%.1f" height="%d" rx="2" fill="%s"/>`+"\n", bx, y+4, ex-bx, rowH-8, color)
	}
	ly := top + len(rows)*rowH + 24
	legend := []struct{ color, text string }{
		{"#9e9e9e", "request"}, {"#e6862e", "acquire (waited)"}, {"#7cb342", "acquire (no wait)"},
		{"#3f7fd0", "hold: the locked section"}, {"#26a69a", "work under the lock"}, {"#8e6bbf", "release"},
	}
	lx := left
	for _, l := range legend {
		p(`<rect x="%d" y="%d" width="12" height="12" rx="2" fill="%s"/><text x="%d" y="%d" fill="#333">%s</text>`+"\n", lx, ly-10, l.color, lx+16, ly, l.text)
		lx += 36 + 7*len(l.text)
	}
	p("</svg>\n")
	return nil
}

// style picks a bar colour and a short note for a span; a root is a request.
func style(s testserver.Span, root bool) (color, note string) {
	switch {
	case root:
		return "#9e9e9e", ""

	case strings.HasPrefix(s.Name, "guard.acquire"):
		wait, _ := s.Attributes[string(tracing.WaitKey)].(float64)
		note = fmt.Sprintf("%v, waited %v", s.Attributes[string(tracing.OutcomeKey)], time.Duration(wait*float64(time.Second)).Round(10*time.Microsecond))
		switch wake := fmt.Sprint(s.Attributes[string(tracing.WakeupsKey)]); wake {
		case "0", "<nil>":
		case "1":
			note += ", 1 wake-up"
		default:
			note += ", " + wake + " wake-ups"
		}
		if wait > 0.0001 {
			return "#e6862e", note
		}
		return "#7cb342", note
	case strings.HasPrefix(s.Name, "guard.hold"):
		if f, ok := s.Attributes[string(tracing.FenceKey)]; ok {
			note = fmt.Sprintf("fence %v", f)
		}
		return "#3f7fd0", note
	case strings.HasPrefix(s.Name, "guard.release"):
		return "#8e6bbf", ""
	}
	return "#26a69a", ""
}

func earliest(ss []testserver.Span) time.Time {
	t := ss[0].Start
	for _, s := range ss[1:] {
		if s.Start.Before(t) {
			t = s.Start
		}
	}
	return t
}

// writeDocsWaterfall draws spans into the docs directory named by GUARD_DOCS_DIR, if set.
func writeDocsWaterfall(t *testing.T, spans []testserver.Span) {
	dir := os.Getenv(docsEnv)
	if dir == "" {
		return
	}
	f, err := os.Create(filepath.Join(dir, "img", "jaeger-waterfall.svg"))
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, waterfall(f, spans, 4))
	t.Logf("wrote %s", f.Name())
}

func TestWaterfallIsWellFormedSVG(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	spans := []testserver.Span{
		{TraceID: "a", SpanID: "1", Name: "POST /accounts/{id}/withdraw", Start: at(0), End: at(10)},
		{TraceID: "a", SpanID: "2", ParentSpanID: "1", Name: "guard.acquire account:{id}", Start: at(0), End: at(6),
			Attributes: map[string]any{string(tracing.WaitKey): 0.006, string(tracing.OutcomeKey): "acquired", string(tracing.WakeupsKey): int64(1)}},
		{TraceID: "a", SpanID: "3", ParentSpanID: "1", Name: "guard.hold account:{id}", Start: at(6), End: at(10)},
		{TraceID: "a", SpanID: "4", ParentSpanID: "3", Name: "guard.release account:{id}", Start: at(9), End: at(10)},
		{TraceID: "b", SpanID: "5", Name: "POST <a & b>", Start: at(1), End: at(3)},
	}
	var b strings.Builder
	require.NoError(t, waterfall(&b, spans, 4))
	d := xml.NewDecoder(strings.NewReader(b.String()))
	for {
		_, err := d.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err, "not well-formed XML")
	}
	require.Contains(t, b.String(), "waited 6ms, 1 wake-up")
}
