package main

import (
	"bytes"
	"fmt"
	"html"
	"io"
	"os"
	"strings"
	"time"
)

// The timeline's layout, in pixels.
const (
	svgWidth  = 1000
	svgLeft   = 132 // the row labels
	svgRight  = 28
	svgTop    = 118 // below the title and the window labels
	rowHeight = 74  // one instance: a lane for the job, one for the tasks, a strip for busy tasks
	laneGap   = 6
	laneTop   = 9
	laneH     = 22
)

// Colours.
const (
	jobColour     = "#e07b2e"
	jobTextColour = "#8a4512"
	taskColour    = "#3574d4"
	busyColour    = "#8d96a0"
	textColour    = "#1f2328"
	mutedColour   = "#656d76"
	okColour      = "#1a7f37"
	failColour    = "#cf222e"
)

// axisSteps are the spacings the time axis may have; it uses the first that gives at most 10
// ticks.
var axisSteps = []time.Duration{
	50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 250 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second,
	30 * time.Second, time.Minute, 5 * time.Minute, 10 * time.Minute, 30 * time.Minute, time.Hour,
}

// writeTimelineFile writes the timeline of o to path.
func writeTimelineFile(path string, o outcome, cfg config, backend string, complete bool) error {
	var b bytes.Buffer
	writeTimeline(&b, o, cfg, backend, complete)
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// writeTimeline draws o as an SVG: a row per instance of every process, with a bar for each
// lock it held while it ran the job or a task, the MinHold window that kept the job's name
// locked after that, and a mark where it found a lock busy; the time axis in milliseconds
// from the start of the first window; the verdict, complete or not, at the bottom.
func writeTimeline(w io.Writer, o outcome, cfg config, backend string, complete bool) {
	var events []event
	for _, e := range o.events {
		if o.covers(e) {
			events = append(events, e)
		}
	}
	names, number := o.instances()
	epoch := o.run.start(o.windows[0])

	// The axis runs to the last thing drawn, rounded up to a tick.
	last := o.run.Window
	for _, e := range events {
		last = max(last, e.Start.Sub(epoch), e.End.Sub(epoch))
		if e.Kind == jobRun {
			last = max(last, e.Start.Add(cfg.minHold()).Sub(epoch))
		}
	}
	step := axisSteps[len(axisSteps)-1]
	for _, s := range axisSteps {
		if last/s < 10 {
			step = s
			break
		}
	}
	axisEnd := (last + step - 1) / step * step
	plotW := float64(svgWidth - svgLeft - svgRight)
	x := func(t time.Time) float64 {
		return svgLeft + plotW*float64(t.Sub(epoch))/float64(axisEnd)
	}
	rowsBottom := svgTop + len(names)*rowHeight
	axisY := rowsBottom + 10
	legendY := axisY + 52
	height := legendY + 58

	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p(`<?xml version="1.0" encoding="UTF-8"?>`)
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" fill="%s">`,
		svgWidth, height, svgWidth, height, textColour)
	p(`<defs><pattern id="minhold" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">`)
	p(`<rect width="6" height="6" fill="#fbe3d0"/><line x1="0" y1="0" x2="0" y2="6" stroke="#f0b48a" stroke-width="3"/></pattern></defs>`)
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>`)
	p(`<text x="24" y="34" font-size="20" font-weight="bold">guard worker: one run per window, one run per task</text>`)
	windows := fmt.Sprintf("%d windows of %v", o.run.Windows, o.run.Window)
	if o.run.Windows == 0 {
		windows = fmt.Sprintf("a window of %v", o.run.Window)
	}
	in := fmt.Sprintf("%d instances", len(names))
	if procs := len(o.processes(0)); procs > 1 {
		in += fmt.Sprintf(" in %d processes", procs)
	}
	p(`<text x="24" y="58" font-size="13" fill="%s">%s, each with its own Guard, on %s.</text>`,
		mutedColour, in, esc(backend))
	p(`<text x="24" y="76" font-size="13" fill="%s">Every instance fires the job %s at every tick (MinHold %v; %s) and walks the whole batch of %d tasks %s.</text>`,
		mutedColour, esc(jobName), cfg.minHold(), windows, o.run.Tasks, esc(taskTemplate))

	// Windows: alternate bands, a dashed line where each starts, and their numbers.
	for k := int64(0); time.Duration(k)*o.run.Window < axisEnd; k++ {
		x0 := x(epoch.Add(time.Duration(k) * o.run.Window))
		x1 := min(x(epoch.Add(time.Duration(k+1)*o.run.Window)), svgWidth-svgRight)
		if k%2 == 0 {
			p(`<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#f3f5f8"/>`, x0, svgTop-22, x1-x0, rowsBottom-svgTop+22)
		}
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#c4cad1" stroke-dasharray="3 3"/>`, x0, svgTop-22, x0, rowsBottom)
		p(`<text x="%.1f" y="%d" font-size="11" fill="%s">window %d</text>`, x0+5, svgTop-8, mutedColour, o.windows[0]+k)
	}

	// Rows: the instance, its lanes, and a line under it.
	for i, name := range names {
		y := svgTop + i*rowHeight
		p(`<text x="24" y="%d" font-size="14" font-weight="bold"><title>process %s</title>instance %d</text>`,
			y+rowHeight/2+5, esc(strings.ReplaceAll(name, "/", ", instance ")), number[name])
		p(`<text x="%d" y="%d" font-size="10" fill="%s" text-anchor="end">job</text>`, svgLeft-8, y+laneTop+15, mutedColour)
		p(`<text x="%d" y="%d" font-size="10" fill="%s" text-anchor="end">tasks</text>`, svgLeft-8, y+laneTop+laneH+laneGap+15, mutedColour)
		p(`<line x1="24" y1="%d" x2="%d" y2="%d" stroke="#d0d7de"/>`, y+rowHeight, svgWidth-svgRight, y+rowHeight)
	}

	// What ran, and where a lock was busy.
	lane := func(e event) float64 {
		y := float64(svgTop + (number[e.Instance]-1)*rowHeight + laneTop)
		if e.Kind == taskRun || e.Kind == busyTask {
			y += laneH + laneGap
		}
		return y
	}
	for _, e := range events {
		x0, y, in := x(e.Start), lane(e), number[e.Instance]
		at := fmt.Sprintf("%d–%d ms", e.Start.Sub(epoch).Milliseconds(), e.End.Sub(epoch).Milliseconds())
		switch e.Kind {
		case jobRun:
			x1, hold := x(e.End), x(e.Start.Add(cfg.minHold()))
			p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="url(#minhold)" rx="3"><title>%s kept locked by MinHold until %d ms</title></rect>`,
				x0, y, hold-x0, laneH, esc(jobName), e.Start.Add(cfg.minHold()).Sub(epoch).Milliseconds())
			p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="%s" rx="3"><title>instance %d ran window %d under fence %d, %s</title></rect>`,
				x0, y, max(x1-x0, 2), laneH, jobColour, in, e.Key, e.Fence, at)
			p(`<text x="%.1f" y="%.1f" font-size="11" font-weight="bold" fill="%s">window %d · fence %d</text>`,
				x1+5, y+15, jobTextColour, e.Key, e.Fence)
		case taskRun:
			width := max(x(e.End)-x0, 2)
			p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="%s" stroke="#ffffff" rx="2"><title>instance %d ran task %d under fence %d, %s</title></rect>`,
				x0, y, width, laneH, taskColour, in, e.Key, e.Fence, at)
			if label := fmt.Sprint(e.Key); width >= float64(7*len(label)+4) {
				p(`<text x="%.1f" y="%.1f" font-size="10" fill="#ffffff" text-anchor="middle">%s</text>`, x0+width/2, y+15, label)
			}
		case busyJob, busyTask:
			what := fmt.Sprintf("window %d", e.Key)
			if e.Kind == busyTask {
				what = fmt.Sprintf("task %d", e.Key)
			}
			cy, r := y+laneH/2, 4.0 // in the job's lane, which is empty there
			if e.Kind == busyTask {
				cy, r = y+laneH+6, 3 // under the task lane, whose bars fill it
			}
			p(`<g stroke="%s" stroke-width="1.6"><title>instance %d found %s busy at %d ms</title>%s</g>`,
				busyColour, in, what, e.Start.Sub(epoch).Milliseconds(), cross(x0, cy, r))
		}
	}

	// The time axis.
	p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s"/>`, svgLeft, axisY, svgWidth-svgRight, axisY, mutedColour)
	for t := time.Duration(0); t <= axisEnd; t += step {
		tx := x(epoch.Add(t))
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s"/>`, tx, axisY, tx, axisY+5, mutedColour)
		p(`<text x="%.1f" y="%d" font-size="11" fill="%s" text-anchor="middle">%d</text>`, tx, axisY+19, mutedColour, t.Milliseconds())
	}
	p(`<text x="%d" y="%d" font-size="11" fill="%s" text-anchor="end">time (ms)</text>`, svgLeft-8, axisY+19, mutedColour)

	// The legend, and the verdict.
	lx := float64(24)
	item := func(swatch, label string) {
		p(`%s<text x="%.1f" y="%d" font-size="12">%s</text>`, swatch, lx+26, legendY+4, esc(label))
		lx += 26 + 6.4*float64(len([]rune(label))) + 24
	}
	item(fmt.Sprintf(`<rect x="%.1f" y="%d" width="20" height="12" rx="2" fill="%s"/>`, lx, legendY-6, jobColour), "job ran ("+jobName+" held)")
	item(fmt.Sprintf(`<rect x="%.1f" y="%d" width="20" height="12" rx="2" fill="url(#minhold)"/>`, lx, legendY-6), "name still locked by MinHold")
	item(fmt.Sprintf(`<rect x="%.1f" y="%d" width="20" height="12" rx="2" fill="%s"/>`, lx, legendY-6, taskColour), "task ran ("+taskTemplate+" held)")
	item(fmt.Sprintf(`<g stroke="%s" stroke-width="1.8">%s</g>`, busyColour, cross(lx+10, float64(legendY), 4)), "found the lock busy: skipped")

	verdict, colour := "✓ every window ran exactly once, and every task ran exactly once", okColour
	if err := o.check(complete); err != nil {
		// Each breach without its runs' details (check's describe), which the process prints.
		lines := strings.Split(err.Error(), "\n")
		for i, l := range lines {
			lines[i], _, _ = strings.Cut(l, " (")
		}
		verdict, colour = "✗ "+strings.Join(lines, "; "), failColour
	} else if !complete {
		verdict = "✓ no window and no task ran twice"
	}
	p(`<text x="24" y="%d" font-size="13" font-weight="bold" fill="%s">%s</text>`, legendY+34, colour, esc(verdict))
	p(`</svg>`)
}

// cross returns the two lines of a × of radius r, centred on (x, y).
func cross(x, y, r float64) string {
	return fmt.Sprintf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/><line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`,
		x-r, y-r, x+r, y+r, x-r, y+r, x+r, y-r)
}

// esc escapes s for XML text and attributes.
func esc(s string) string { return html.EscapeString(s) }
