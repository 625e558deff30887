package bench

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardlock/guard/internal/testserver"
)

var (
	chartsDir   = flag.String("charts", "", "write the performance page's charts and figures into this directory (TestCharts)")
	chartsRun   = flag.Duration("charts.run", time.Second, "how long each contended case of TestCharts runs")
	chartsHeld  = flag.String("charts.held", "10000,25000,50000,100000", "the numbers of held locks TestCharts measures")
	chartsTurns = flag.Int("charts.ops", 3000, "uncontended operations per library in TestCharts")
)

// TestCharts measures what docs/performance.md shows, on servers it starts — redis-servers for
// the comparison of Redis lock libraries, and a server of each store's kind for the comparison
// of guard's stores (stores_test.go) — and writes the charts (SVG) and a table of every figure
// with the machine and versions (figures.md) into -charts. It asserts no speed. It is the one
// command behind the page:
//
//	cd bench && go test -run TestCharts -charts=../docs/perf -timeout 30m
func TestCharts(t *testing.T) {
	if *chartsDir == "" {
		t.Skip("pass -charts DIR to measure and write the performance charts")
	}
	require := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	require(os.MkdirAll(*chartsDir, 0o755))
	started := time.Now()
	srv := testserver.StartRedis(t)
	head := fmt.Sprintf("# Measured figures\n\nWritten by `cd bench && go test -run TestCharts -charts=../docs/perf` on %s. Do not edit: run it again.\n\n",
		started.UTC().Format("2006-01-02 15:04 MST")) + machine(t, srv.Addr)
	var fig strings.Builder // the figures, after head and the stores' servers

	// P1: uncontended acquire and release, in interleaved turns.
	fig.WriteString("\n## P1: uncontended acquire and release\n\n| library | median µs/op | allocs/op | ratio to redislock |\n|---|---|---|---|\n")
	p1 := uncontended(t, srv.Addr, *chartsTurns)
	var labels, notes []string
	var values []float64
	for _, r := range p1 {
		fmt.Fprintf(&fig, "| %s | %.1f | %.0f | %.2f |\n", r.name, r.micros, r.allocs, r.ratio)
		labels, values = append(labels, r.name), append(values, r.micros)
		notes = append(notes, fmt.Sprintf("%.1f µs, %.0f allocs", r.micros, r.allocs))
	}
	require(writeChart("p1-uncontended.svg", barChart("P1: uncontended acquire + release (median)", "µs per operation", labels, values, notes)))

	// P2: one name, workers on one instance each, against goroutines and hold.
	libs := []string{"guard", "redislock-1ms", "redsync-1ms"}
	open := func(name string) func(context.Context, string) (func(), error) {
		i := slices.IndexFunc(contenders, func(c contender) bool { return c.name == name })
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 128})
		t.Cleanup(func() { _ = client.Close() })
		return contenders[i].open(t, client)
	}
	locks := map[string]func(context.Context, string) (func(), error){}
	for _, l := range libs {
		locks[l] = open(l)
	}
	type point struct {
		x    string
		util map[string]float64
		p99  map[string]float64
	}
	sweep := func(title string, xs []string, run func(x int, lib string) contention) []point {
		fmt.Fprintf(&fig, "\n## P2: %s\n\n| %s | library | utilisation %% | p50 ms | p99 ms | acquisitions/s |\n|---|---|---|---|---|---|\n", title, strings.SplitN(title, " ", 3)[1])
		var pts []point
		for i, x := range xs {
			p := point{x: x, util: map[string]float64{}, p99: map[string]float64{}}
			for _, l := range libs {
				r := run(i, l)
				if r.overlaps > 0 {
					t.Errorf("%s: %d overlapping holders", l, r.overlaps)
				}
				p.util[l], p.p99[l] = r.util, r.p99
				fmt.Fprintf(&fig, "| %s | %s | %.1f | %.2f | %.2f | %.0f |\n", x, l, r.util, r.p50, r.p99, r.perSecond)
			}
			pts = append(pts, p)
		}
		return pts
	}
	goroutines := []int{1, 4, 16, 64}
	byG := sweep("against goroutines (1 ms hold)", []string{"1", "4", "16", "64"}, func(i int, l string) contention {
		return contendFor(fmt.Sprintf("bench:charts:g%d:%s", goroutines[i], l), []func(context.Context, string) (func(), error){locks[l]}, goroutines[i], time.Millisecond, *chartsRun)
	})
	holds := []time.Duration{100 * time.Microsecond, time.Millisecond, 10 * time.Millisecond}
	byH := sweep("against hold (16 goroutines)", []string{"0.1 ms", "1 ms", "10 ms"}, func(i int, l string) contention {
		return contendFor(fmt.Sprintf("bench:charts:h%d:%s", i, l), []func(context.Context, string) (func(), error){locks[l]}, 16, holds[i], *chartsRun)
	})
	for _, c := range []struct {
		file, title, x string
		pts            []point
		util           bool
	}{
		{"p2-util-goroutines.svg", "P2: utilisation of one name, 1 ms hold", "goroutines", byG, true},
		{"p2-p99-goroutines.svg", "P2: p99 wait, 1 ms hold", "goroutines", byG, false},
		{"p2-util-hold.svg", "P2: utilisation of one name, 16 goroutines", "hold", byH, true},
		{"p2-p99-hold.svg", "P2: p99 wait, 16 goroutines", "hold", byH, false},
	} {
		var xs []string
		series := make([]series, len(libs))
		for i, l := range libs {
			series[i].name = l
		}
		for _, p := range c.pts {
			xs = append(xs, p.x)
			for i, l := range libs {
				v := p.p99[l]
				if c.util {
					v = p.util[l]
				}
				series[i].values = append(series[i].values, v)
			}
		}
		y := "p99 wait, ms"
		if c.util {
			y = "utilisation, %"
		}
		require(writeChart(c.file, lineChart(c.title, c.x, y, xs, series)))
	}

	// The stores, each through a Guard on a server of its own, stopped at the end of the subtest:
	// before P4, whose 100,000 locks load the machine most.
	var stores string
	t.Run("stores", func(t *testing.T) { stores = compareStores(t, &fig, *storesOps, *storesRun) })

	// P4: watchdog locks held by one Guard.
	fig.WriteString("\n## P4: watchdog locks held by one Guard (3 s watchdog: each renewed every second)\n\n| held locks | CPU of the process, % of a core | scripts/s on the server | lost | heap bytes per lock |\n|---|---|---|---|---|\n")
	var xs []string
	var cpu, mem series
	cpu.name, mem.name = "CPU, % of a core", "heap bytes per lock"
	for _, n := range sizes(t, *chartsHeld) {
		r := runHeld(t, n, 3*time.Second)
		fmt.Fprintf(&fig, "| %d | %.1f | %.0f | %d | %.0f |\n", n, r.cpu, r.commands, r.lost, r.perLock)
		xs = append(xs, fmt.Sprintf("%dk", n/1000))
		cpu.values, mem.values = append(cpu.values, r.cpu), append(mem.values, r.perLock)
	}
	require(writeChart("p4-cpu.svg", lineChart("P4: CPU of the Guard's process against held locks", "held locks", "% of one core", xs, []series{cpu})))
	require(writeChart("p4-memory.svg", lineChart("P4: heap per held lock", "held locks", "bytes", xs, []series{mem})))
	fmt.Fprintf(&fig, "\nThe run took %v.\n", time.Since(started).Round(time.Second))
	require(os.WriteFile(filepath.Join(*chartsDir, "figures.md"), []byte(head+stores+fig.String()), 0o644))
}

// machine describes where the figures were measured.
func machine(t *testing.T, addr string) string {
	var b strings.Builder
	model := "unknown"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
		_ = f.Close()
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(&b, "- Machine: %s/%s, %d CPUs (%s), load average at the start %s — shared with other work, so the figures are noisy\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), model, strings.Join(strings.Fields(string(load))[:3], " "))
	fmt.Fprintf(&b, "- Go %s, redis-server %s on loopback, started by the run\n", runtime.Version(), redisVersion(t, addr))
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/redis/go-redis/v9", "github.com/bsm/redislock", "github.com/go-redsync/redsync/v4",
				"go.mongodb.org/mongo-driver/v2", "github.com/jackc/pgx/v5", "github.com/go-sql-driver/mysql", "go.etcd.io/etcd/client/v3":
				fmt.Fprintf(&b, "- %s %s\n", d.Path, d.Version)
			}
		}
	}
	b.WriteString("- The stores' servers, on loopback, started by the run for the store comparison:\n")
	return b.String()
}

// p1Result is one library's uncontended cost.
type p1Result struct {
	name          string
	micros, ratio float64
	allocs        float64
}

// uncontended takes and releases a free name ops times per library, in turns of 50, and
// returns each library's median time per operation, its ratio to redislock's, and its
// allocations per operation.
func uncontended(t *testing.T, addr string, ops int) []p1Result {
	const turn = 50
	ctx := context.Background()
	locks := make([]locker, len(libs))
	for i, l := range libs {
		client, _ := newClient(t, addr)
		locks[i] = l.open(t, client)
	}
	once := func(i int) {
		unlock, err := locks[i](ctx, "bench:charts:uncontended:"+libs[i].name, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := unlock(); err != nil {
			t.Fatal(err)
		}
	}
	turns := make([]func(), len(libs))
	for i := range turns {
		turns[i] = func() { once(i) }
	}
	medians := interleaved(ops, turn, turns)
	out := make([]p1Result, len(libs))
	base := 0.0
	for i, l := range libs {
		out[i] = p1Result{name: l.name, micros: float64(medians[i]) / 1e3,
			allocs: testing.AllocsPerRun(200, turns[i])}
		if l.name == "redislock" {
			base = out[i].micros
		}
	}
	for i := range out {
		out[i].ratio = out[i].micros / base
	}
	return out
}

// interleaved calls each of ops n times in all, in turns of turn calls, one op's turn after
// another's, so that a slow stretch of a noisy machine lands on all of them; it returns each
// op's median time per call over its turns.
func interleaved(n, turn int, ops []func()) []time.Duration {
	times := make([][]time.Duration, len(ops))
	for done := 0; done < n; done += turn {
		for i, op := range ops {
			start := time.Now()
			for range turn {
				op()
			}
			times[i] = append(times[i], time.Since(start)/time.Duration(turn))
		}
	}
	medians := make([]time.Duration, len(ops))
	for i, d := range times {
		slices.Sort(d)
		medians[i] = d[len(d)/2]
	}
	return medians
}

func writeChart(name, svg string) error {
	return os.WriteFile(filepath.Join(*chartsDir, name), []byte(svg), 0o644)
}

// series is one line of a chart.
type series struct {
	name   string
	values []float64
}

// Chart geometry, in SVG user units.
const (
	chartW, chartH            = 640, 360
	padL, padR, padT, padB    = 70, 170, 40, 50
	plotW, plotH              = chartW - padL - padR, chartH - padT - padB
	chartFont                 = `font-family="sans-serif" font-size="12"`
	gridColour, axisColour    = "#ddd", "#333"
	titleSize, legendSpacing  = 14, 18
	markerRadius, strokeWidth = 3, 2
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"}

// frame starts an SVG with a title, a y axis from 0 to top with grid lines, and its label.
func frame(b *strings.Builder, title, ylabel string, top float64) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" %s>`+"\n", chartW, chartH, chartW, chartH, chartFont)
	fmt.Fprintf(b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="%d" font-weight="bold">%s</text>`+"\n", padL, padT-15, titleSize, html.EscapeString(title))
	for i := 0; i <= 4; i++ {
		y := float64(padT) + float64(plotH)*(1-float64(i)/4)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s"/>`+"\n", padL, y, padL+plotW, y, gridColour)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", padL-6, y+4, tick(top*float64(i)/4))
	}
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s"/>`+"\n", padL, padT+plotH, padL+plotW, padT+plotH, axisColour)
	fmt.Fprintf(b, `<text transform="translate(16 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", padT+plotH/2, html.EscapeString(ylabel))
}

// top rounds the largest value up to a round axis end.
func top(max float64) float64 {
	if max <= 0 {
		return 1
	}
	step := 1.0
	for step*10 < max {
		step *= 10
	}
	for step > max {
		step /= 10
	}
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if step*m >= max*1.05 {
			return step * m
		}
	}
	return step * 10
}

func tick(v float64) string {
	if v == float64(int64(v)) {
		return fmt.Sprint(int64(v))
	}
	return fmt.Sprintf("%.2g", v)
}

// barChart draws one bar per label, with a note above each.
func barChart(title, ylabel string, labels []string, values []float64, notes []string) string {
	var b strings.Builder
	hi := top(slices.Max(values))
	frame(&b, title, ylabel, hi)
	slot := float64(plotW) / float64(len(values))
	for i, v := range values {
		h := float64(plotH) * v / hi
		x := float64(padL) + slot*float64(i) + slot*0.2
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", x, float64(padT+plotH)-h, slot*0.6, h, palette[i%len(palette)])
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x+slot*0.3, float64(padT+plotH)-h-6, html.EscapeString(notes[i]))
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x+slot*0.3, padT+plotH+18, html.EscapeString(labels[i]))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// lineChart draws each series over the categories xs, evenly spaced, with a legend.
func lineChart(title, xlabel, ylabel string, xs []string, all []series) string {
	var b strings.Builder
	var hi float64
	for _, s := range all {
		hi = max(hi, slices.Max(s.values))
	}
	hi = top(hi)
	frame(&b, title, ylabel, hi)
	x := func(i int) float64 {
		if len(xs) == 1 {
			return float64(padL + plotW/2)
		}
		return float64(padL) + float64(plotW)*float64(i)/float64(len(xs)-1)
	}
	for i, label := range xs {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(i), padT+plotH+18, html.EscapeString(label))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", padL+plotW/2, padT+plotH+38, html.EscapeString(xlabel))
	for k, s := range all {
		colour := palette[k%len(palette)]
		var pts []string
		for i, v := range s.values {
			y := float64(padT) + float64(plotH)*(1-v/hi)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), y))
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="%d" fill="%s"><title>%s: %.3g</title></circle>`+"\n", x(i), y, markerRadius, colour, html.EscapeString(s.name), v)
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="%d"/>`+"\n", strings.Join(pts, " "), colour, strokeWidth)
		ly := padT + 10 + k*legendSpacing
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="%d"/>`+"\n", padL+plotW+15, ly, padL+plotW+35, ly, colour, strokeWidth)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", padL+plotW+40, ly+4, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// panel is one measure of a rowChart, on an axis of its own: one bar per row and series.
type panel struct {
	title  string     // the measure and its unit
	series []series   // each with a value per row
	notes  [][]string // written after each bar: per series, per row
	log    bool       // a logarithmic axis, from the decade below the smallest value
}

// Geometry of a rowChart, in SVG user units.
const (
	rowLabelW, rowPanelW, rowNoteW = 200, 230, 80 // the rows' labels; a panel's axis; its notes
	rowBarH, rowGap                = 14, 10       // a bar; the space between rows
)

// rowChart draws one row per label and, in each panel side by side, a horizontal bar per
// series in that row, with its note after it; a legend names the series when there are
// several.
func rowChart(title string, labels []string, panels []panel) string {
	nSeries := len(panels[0].series)
	rowH := nSeries*rowBarH + rowGap
	plotTop := padT + 20
	plotBottom := plotTop + len(labels)*rowH
	height := plotBottom + 30
	if nSeries > 1 {
		height += legendSpacing * nSeries
	}
	width := rowLabelW + len(panels)*(rowPanelW+rowNoteW)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" %s>`+"\n", width, height, width, height, chartFont)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="%d" font-size="%d" font-weight="bold">%s</text>`+"\n", padT-15, titleSize, html.EscapeString(title))
	for r, label := range labels {
		y := plotTop + r*rowH + rowGap/2 + nSeries*rowBarH/2
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", rowLabelW-8, y+4, html.EscapeString(label))
	}
	for p, pn := range panels {
		x0 := float64(rowLabelW + p*(rowPanelW+rowNoteW))
		var lo, hi float64
		for _, s := range pn.series {
			hi = max(hi, slices.Max(s.values))
		}
		var ticks []float64
		frac := func(v float64) float64 { return v / hi }
		if pn.log {
			lo = hi
			for _, s := range pn.series {
				for _, v := range s.values {
					if v > 0 {
						lo = min(lo, v)
					}
				}
			}
			lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
			if hi <= lo {
				hi = lo * 10
			}
			for v := lo; v <= hi*1.001; v *= 10 {
				ticks = append(ticks, v)
			}
			frac = func(v float64) float64 {
				if v <= lo {
					return 0
				}
				return math.Log10(v/lo) / math.Log10(hi/lo)
			}
		} else {
			hi = top(hi)
			for i := 0; i <= 4; i++ {
				ticks = append(ticks, hi*float64(i)/4)
			}
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-weight="bold">%s</text>`+"\n", x0, plotTop-8, html.EscapeString(pn.title))
		for _, v := range ticks {
			x := x0 + rowPanelW*frac(v)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s"/>`+"\n", x, plotTop, x, plotBottom, gridColour)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, plotBottom+16, tick(v))
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s"/>`+"\n", x0, plotTop, x0, plotBottom, axisColour)
		for k, s := range pn.series {
			for r, v := range s.values {
				y := plotTop + r*rowH + rowGap/2 + k*rowBarH
				w := rowPanelW * min(frac(v), 1)
				fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s: %.3g</title></rect>`+"\n",
					x0, y+1, w, rowBarH-2, palette[k%len(palette)], html.EscapeString(s.name), v)
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="11">%s</text>`+"\n", x0+w+4, y+rowBarH-3, html.EscapeString(pn.notes[k][r]))
			}
		}
	}
	if nSeries > 1 {
		for k, s := range panels[0].series {
			y := plotBottom + 30 + k*legendSpacing
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="20" height="%d" fill="%s"/>`+"\n", rowLabelW, y-rowBarH+3, rowBarH-2, palette[k%len(palette)])
			fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", rowLabelW+26, y, html.EscapeString(s.name))
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}
