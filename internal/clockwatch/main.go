// Command clockwatch watches this host's wall clock against its monotonic clock while the tests
// run, writes each step to -log as it sees it (a line: the Unix time in nanoseconds, and the
// step in nanoseconds, negative when the clock went back), and when stopped (SIGINT or
// SIGTERM) prints the steps it saw: how many, the largest, and when. The tests' servers decide expiry on this clock (docs/operations.md#clocks), so a host
// whose clock is stepped — a virtual machine catching up after a pause — ends leases early at
// once; scripts/test-all prints this beside the results so that a failure can be told apart
// from such a step.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	every := flag.Duration("every", 10*time.Millisecond, "how often to look at the clocks")
	slack := flag.Duration("slack", time.Millisecond, "how far the clocks may move apart between two looks before it counts as a step")
	logPath := flag.String("log", "", "a file to append each step to, as it is seen")
	flag.Parse()
	var log *os.File
	if *logPath != "" {
		f, err := os.OpenFile(*logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "clockwatch:", err)
			os.Exit(2)
		}
		defer f.Close()
		log = f
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	tick := time.NewTicker(*every)
	defer tick.Stop()

	type step struct {
		at time.Time
		by time.Duration
	}
	var steps []step
	var total time.Duration
	start := time.Now()
	offset := func(now time.Time) time.Duration { return now.Round(0).Sub(start.Round(0)) - now.Sub(start) }
	last := time.Duration(0)
	for {
		select {
		case now := <-tick.C:
			off := offset(now)
			if d := off - last; d.Abs() > *slack {
				steps = append(steps, step{now, d})
				if log != nil {
					fmt.Fprintf(log, "%d %d\n", now.UnixNano(), d.Nanoseconds())
				}
			}
			last = off
		case <-stop:
			total = offset(time.Now())
			fmt.Printf("clockwatch: over %v the wall clock moved %v from the monotonic one, in %d steps larger than %v\n",
				time.Since(start).Round(time.Second), total, len(steps), *slack)
			var largest time.Duration
			for _, s := range steps {
				largest = max(largest, s.by.Abs())
			}
			if len(steps) > 0 {
				fmt.Printf("clockwatch: the largest step: %v\n", largest)
			}
			for i, s := range steps {
				if i == 20 {
					fmt.Printf("clockwatch: ... %d more\n", len(steps)-i)
					break
				}
				fmt.Printf("clockwatch: %s %+v\n", s.at.Format(time.TimeOnly), s.by)
			}
			return
		}
	}
}
