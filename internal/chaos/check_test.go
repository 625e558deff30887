package chaos_test

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard/internal/chaos"
	"github.com/guardlock/guard/watchdog"
)

// history builds a hand-made History; times are in milliseconds from the run's start.
type history struct {
	h chaos.History
	n int
}

func ms(t int64) int64 { return t * int64(time.Millisecond) }

func newHistory() *history { return &history{h: chaos.History{Start: 0, End: ms(100_000)}} }

// grant records an acquisition by worker w of name with a lease of ttl ms, whose attempt was
// sent at start and granted at grant; it returns the acquisition's token.
func (b *history) grant(w int, name string, fence uint64, start, grant, ttl int64) string {
	b.n++
	call, token := fmt.Sprintf("call%d", b.n), fmt.Sprintf("token%d", b.n)
	lease := time.Duration(ms(ttl))
	b.event(chaos.Event{Kind: chaos.EvStart, Worker: w, Inc: 1, At: ms(start), Call: call, Name: name,
		Mode: chaos.ModeLease, TTL: int64(lease)})
	b.event(chaos.Event{Kind: chaos.EvGrant, Worker: w, Inc: 1, At: ms(grant), Call: call, Token: token, Name: name,
		Fence: fence, Deadline: watchdog.Deadline(time.Unix(0, ms(start)), lease).UnixNano()})
	return token
}

func (b *history) event(e chaos.Event) { b.h.Events = append(b.h.Events, e) }

// ended records that the lock of token ended on its own at t (its lease ran out).
func (b *history) ended(w int, token string, t int64) {
	b.event(chaos.Event{Kind: chaos.EvLost, Worker: w, Inc: 1, At: ms(t), Token: token, Err: "guard: lease expired"})
	b.event(chaos.Event{Kind: chaos.EvDone, Worker: w, Inc: 1, At: ms(t), Token: token, Err: "guard: lease expired"})
}

// released records a release of token called at t that returned a millisecond later.
func (b *history) released(w int, token string, t int64) {
	b.event(chaos.Event{Kind: chaos.EvRelease, Worker: w, Inc: 1, At: ms(t), Token: token})
	b.event(chaos.Event{Kind: chaos.EvDone, Worker: w, Inc: 1, At: ms(t), Token: token, Err: "guard: lock released"})
	b.event(chaos.Event{Kind: chaos.EvReleased, Worker: w, Inc: 1, At: ms(t + 1), Token: token})
}

// write records a fenced write of token sent at t and judged by the resource at t+1.
func (b *history) write(w int, token, name string, fence uint64, t int64, accepted bool) {
	b.n++
	outcome := "rejected"
	if accepted {
		outcome = "accepted"
	}
	b.event(chaos.Event{Kind: chaos.EvWrite, Worker: w, Inc: 1, At: ms(t), Token: token, Seq: b.n, Fence: fence})
	b.h.Writes = append(b.h.Writes, chaos.Write{Name: name, Fence: fence, Token: token, Seq: b.n, Arrival: ms(t + 1), Accepted: accepted})
	b.event(chaos.Event{Kind: chaos.EvWrote, Worker: w, Inc: 1, At: ms(t + 2), Token: token, Seq: b.n, Outcome: outcome})
}

// TestCheck feeds the checker hand-made histories: each broken guarantee must fail the
// check, and the cases that only look alike (a paused holder, documented data loss, a
// stale write that was rejected) must not.
func TestCheck(t *testing.T) {
	tests := []struct {
		name  string
		build func(b *history)
		want  chaos.Report // the counters compared; Linearizable by prefix
		fail  bool
	}{{
		name: "holders one after the other",
		build: func(b *history) {
			a := b.grant(0, "x", 1, 0, 2, 600)
			b.write(0, a, "x", 1, 10, true)
			b.released(0, a, 100)
			c := b.grant(1, "x", 2, 50, 102, 600)
			b.write(1, c, "x", 2, 110, true)
			b.released(1, c, 200)
		},
		want: chaos.Report{Linearizable: "ok"},
	}, {
		name: "overlap: a grant while the holder's context lives",
		build: func(b *history) {
			a := b.grant(0, "x", 1, 0, 2, 600)
			c := b.grant(1, "x", 2, 100, 300, 600) // a's context ends only at 590
			b.ended(0, a, 590)
			b.released(1, c, 400)
		},
		want: chaos.Report{Overlaps: 1, Outlived: 1, Linearizable: "illegal"},
		fail: true,
	}, {
		name: "stale write accepted",
		build: func(b *history) {
			a := b.grant(0, "x", 1, 0, 2, 600)
			b.released(0, a, 100)
			c := b.grant(1, "x", 2, 50, 102, 600)
			b.write(1, c, "x", 2, 110, true)
			b.write(0, a, "x", 1, 120, true) // a late write the resource should have refused
			b.released(1, c, 200)
		},
		want: chaos.Report{StaleAccepted: 1, LateWrites: 1, Linearizable: "ok"},
		fail: true,
	}, {
		name: "stale write rejected: fencing at work",
		build: func(b *history) {
			a := b.grant(0, "x", 1, 0, 2, 600)
			b.released(0, a, 100)
			c := b.grant(1, "x", 2, 50, 102, 600)
			b.write(1, c, "x", 2, 110, true)
			b.write(0, a, "x", 1, 120, false)
			b.released(1, c, 200)
		},
		want: chaos.Report{StaleRejected: 1, LateWrites: 1, Linearizable: "ok"},
	}, {
		name: "not linearizable: the fence goes backwards",
		build: func(b *history) {
			a := b.grant(0, "x", 5, 0, 2, 600)
			b.released(0, a, 100)
			c := b.grant(1, "x", 3, 150, 152, 600)
			b.released(1, c, 200)
		},
		want: chaos.Report{Linearizable: "illegal"},
		fail: true,
	}, {
		name: "not linearizable: the fence repeats",
		build: func(b *history) {
			a := b.grant(0, "x", 5, 0, 2, 600)
			b.released(0, a, 100)
			c := b.grant(1, "x", 5, 150, 152, 600)
			b.released(1, c, 200)
		},
		want: chaos.Report{Linearizable: "illegal"},
		fail: true,
	}, {
		name: "a holder stopped past its deadline is no overlap",
		build: func(b *history) {
			a := b.grant(0, "x", 1, 0, 2, 600) // deadline 592
			b.h.Stops = append(b.h.Stops, chaos.Stop{Worker: 0, Inc: 1, From: ms(300), To: ms(1500)})
			c := b.grant(1, "x", 2, 590, 700, 600)
			b.write(1, c, "x", 2, 710, true)
			b.write(0, a, "x", 1, 1505, false) // resumed before it saw its context end
			b.ended(0, a, 1510)
			b.released(1, c, 1000)
		},
		want: chaos.Report{StaleRejected: 1, LateWrites: 1, Linearizable: "ok"},
	}, {
		name: "the same holder, not stopped, is an overlap",
		build: func(b *history) {
			a := b.grant(0, "x", 1, 0, 2, 600)
			c := b.grant(1, "x", 2, 590, 700, 600)
			b.ended(0, a, 1510)
			b.released(1, c, 1000)
		},
		want: chaos.Report{Overlaps: 1, Outlived: 1, Linearizable: "illegal"},
		fail: true,
	}, {
		name: "data loss: two holders, as documented, fences still in order",
		build: func(b *history) {
			a := b.grant(0, "x", 1, 0, 2, 600)
			b.h.Wipes = append(b.h.Wipes, chaos.Wipe{Names: []string{"x"}, From: ms(100), To: ms(150)})
			c := b.grant(1, "x", 1_000_000, 160, 200, 600)
			b.ended(0, a, 592)
			b.released(1, c, 700)
		},
		want: chaos.Report{DataLossOverlaps: 1, Linearizable: "ok"},
	}, {
		name: "data loss: the grant's reply came back after the crash began",
		build: func(b *history) {
			// The server granted a before it was killed at 100 ms; the reply reached the
			// client at 102 ms. The wipe lost a's grant as surely as one answered earlier.
			a := b.grant(0, "x", 1, 0, 102, 600)
			b.h.Wipes = append(b.h.Wipes, chaos.Wipe{Names: []string{"x"}, From: ms(100), To: ms(150)})
			c := b.grant(1, "x", 1_000_000, 160, 200, 600)
			b.ended(0, a, 592)
			b.released(1, c, 700)
		},
		want: chaos.Report{DataLossOverlaps: 1, Linearizable: "ok"},
	}, {
		name: "data loss: a grant of the wiped server answered after one of the restarted server",
		build: func(b *history) {
			// The server granted c before it was killed at 100 ms; c's reply was held up
			// until 196 ms. Meanwhile the restarted server, which lost c's grant, granted a
			// (called at 160 ms, answered at 195 ms). Seen in a chaos run on Redis.
			c := b.grant(1, "x", 1, 0, 196, 600)
			b.h.Wipes = append(b.h.Wipes, chaos.Wipe{Names: []string{"x"}, From: ms(100), To: ms(150)})
			a := b.grant(0, "x", 1_000_000, 160, 195, 600)
			b.released(1, c, 198)
			b.released(0, a, 200)
		},
		want: chaos.Report{DataLossOverlaps: 1, Linearizable: "ok"},
	}, {
		name: "no data loss: a grant answered late, behind a newer grant, with no wipe between",
		build: func(b *history) {
			c := b.grant(1, "x", 1, 0, 196, 600)
			b.h.Wipes = append(b.h.Wipes, chaos.Wipe{Names: []string{"x"}, From: ms(300), To: ms(350)})
			a := b.grant(0, "x", 2, 160, 195, 600)
			b.released(1, c, 198)
			b.released(0, a, 200)
		},
		want: chaos.Report{Overlaps: 1, Outlived: 1, Linearizable: "illegal"},
		fail: true,
	}, {
		name: "data loss that resets the fence",
		build: func(b *history) {
			a := b.grant(0, "x", 7, 0, 2, 600)
			b.h.Wipes = append(b.h.Wipes, chaos.Wipe{Names: []string{"x"}, From: ms(100), To: ms(150)})
			c := b.grant(1, "x", 1, 160, 200, 600)
			b.ended(0, a, 592)
			b.released(1, c, 700)
		},
		want: chaos.Report{DataLossOverlaps: 1, Linearizable: "illegal"},
		fail: true,
	}, {
		name: "a killed holder's lease runs out",
		build: func(b *history) {
			b.grant(0, "x", 1, 0, 2, 600)
			b.h.Kills = append(b.h.Kills, chaos.Kill{Worker: 0, Inc: 1, At: ms(100)})
			c := b.grant(1, "x", 2, 300, 610, 600)
			b.released(1, c, 700)
		},
		want: chaos.Report{Linearizable: "ok"},
	}, {
		name: "a write the harness cannot place",
		build: func(b *history) {
			b.event(chaos.Event{Kind: chaos.EvWrite, Worker: 0, Inc: 1, At: ms(5), Token: "nobody", Seq: 1, Fence: 1})
		},
		want: chaos.Report{Linearizable: "ok"},
		fail: true,
	}, {
		name: "a write number used twice by one lock",
		build: func(b *history) {
			a := b.grant(0, "x", 1, 0, 2, 600)
			b.write(0, a, "x", 1, 10, true)
			b.n-- // the next write reuses the number
			b.write(0, a, "x", 1, 20, true)
			b.released(0, a, 100)
		},
		want: chaos.Report{Linearizable: "ok"},
		fail: true,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newHistory()
			tt.build(b)
			dir := t.TempDir()
			r := chaos.Check(&b.h, dir)
			got := chaos.Report{
				Overlaps: r.Overlaps, DataLossOverlaps: r.DataLossOverlaps, Outlived: r.Outlived,
				StaleAccepted: r.StaleAccepted, StaleRejected: r.StaleRejected, LateWrites: r.LateWrites,
				Linearizable: r.Linearizable,
			}
			if strings.HasPrefix(got.Linearizable, tt.want.Linearizable) {
				got.Linearizable = tt.want.Linearizable
			}
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.fail, r.Failed(), "violations: %q\nproblems: %q", r.Violations, r.Problems)
			if tt.want.Linearizable == "illegal" {
				files, _ := filepath.Glob(filepath.Join(dir, "porcupine-*.html"))
				assert.NotEmpty(t, files, "no timeline of the illegal history")
			}
		})
	}
}

// grantPrim records an acquisition of a primitive, as grant does a mutex's.
func (b *history) grantPrim(w int, name, prim string, fence uint64, start, grant, ttl int64) string {
	token := b.grant(w, name, fence, start, grant, ttl)
	for i := len(b.h.Events) - 2; i < len(b.h.Events); i++ {
		b.h.Events[i].Prim = prim
	}
	return token
}

// TestCheckPrimitives feeds the checker hand-made histories of a semaphore of two and a
// read-write lock: more than two permits live, a writer with a reader, and a fence below one
// granted before the call must fail; holders within the rules, or after a data loss, must not.
func TestCheckPrimitives(t *testing.T) {
	type counts struct{ PermitChecks, MaxLive, Excess, RWChecks, RWOverlaps, Disorders, DataLoss int }
	tests := []struct {
		name  string
		build func(b *history)
		want  counts
		fail  bool
	}{{
		name: "two permits at once, a third after a release",
		build: func(b *history) {
			p1 := b.grantPrim(0, "s", chaos.PrimPermit, 1, 0, 2, 600)
			p2 := b.grantPrim(1, "s", chaos.PrimPermit, 2, 1, 3, 600)
			b.released(0, p1, 100)
			p3 := b.grantPrim(2, "s", chaos.PrimPermit, 3, 50, 102, 600)
			b.released(1, p2, 200)
			b.released(2, p3, 200)
		},
		want: counts{PermitChecks: 3, MaxLive: 2},
	}, {
		name: "three permits live",
		build: func(b *history) {
			p1 := b.grantPrim(0, "s", chaos.PrimPermit, 1, 0, 2, 600)
			p2 := b.grantPrim(1, "s", chaos.PrimPermit, 2, 1, 3, 600)
			p3 := b.grantPrim(2, "s", chaos.PrimPermit, 3, 50, 60, 600)
			b.released(0, p1, 100)
			b.released(1, p2, 100)
			b.released(2, p3, 100)
		},
		want: counts{PermitChecks: 3, MaxLive: 3, Excess: 1},
		fail: true,
	}, {
		name: "three permits live after a data loss",
		build: func(b *history) {
			p1 := b.grantPrim(0, "s", chaos.PrimPermit, 1, 0, 2, 600)
			p2 := b.grantPrim(1, "s", chaos.PrimPermit, 2, 1, 3, 600)
			b.h.Wipes = append(b.h.Wipes, chaos.Wipe{Names: []string{"s"}, From: ms(20), To: ms(30)})
			p3 := b.grantPrim(2, "s", chaos.PrimPermit, 3, 50, 60, 600)
			b.released(0, p1, 100)
			b.released(1, p2, 100)
			b.released(2, p3, 100)
		},
		want: counts{PermitChecks: 3, MaxLive: 2, DataLoss: 1},
	}, {
		name: "readers together, then a writer",
		build: func(b *history) {
			r1 := b.grantPrim(0, "rw", chaos.PrimRead, 1, 0, 2, 600)
			r2 := b.grantPrim(1, "rw", chaos.PrimRead, 2, 1, 3, 600)
			b.released(0, r1, 100)
			b.released(1, r2, 100)
			w := b.grantPrim(2, "rw", chaos.PrimWrite, 3, 50, 102, 600)
			b.write(2, w, "rw", 3, 110, true)
			b.released(2, w, 200)
		},
		want: counts{RWChecks: 1},
	}, {
		name: "a writer with a reader",
		build: func(b *history) {
			r1 := b.grantPrim(0, "rw", chaos.PrimRead, 1, 0, 2, 600)
			w := b.grantPrim(2, "rw", chaos.PrimWrite, 2, 50, 60, 600)
			b.released(0, r1, 100)
			b.released(2, w, 200)
		},
		want: counts{RWChecks: 1, RWOverlaps: 1},
		fail: true,
	}, {
		name: "a fence below one granted before the call",
		build: func(b *history) {
			p1 := b.grantPrim(0, "s", chaos.PrimPermit, 5, 0, 2, 600)
			b.released(0, p1, 10)
			p2 := b.grantPrim(1, "s", chaos.PrimPermit, 4, 20, 22, 600)
			b.released(1, p2, 30)
		},
		want: counts{PermitChecks: 2, MaxLive: 1, Disorders: 1},
		fail: true,
	}, {
		name: "fences of overlapping calls in either order",
		build: func(b *history) {
			p1 := b.grantPrim(0, "s", chaos.PrimPermit, 5, 0, 20, 600)
			p2 := b.grantPrim(1, "s", chaos.PrimPermit, 4, 10, 22, 600)
			b.released(0, p1, 30)
			b.released(1, p2, 30)
		},
		want: counts{PermitChecks: 2, MaxLive: 2},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newHistory()
			b.h.Semaphore, b.h.Permits, b.h.RW = "s", 2, "rw"
			tt.build(b)
			r := chaos.Check(&b.h, "")
			got := counts{r.PermitChecks, r.MaxPermitHolders, r.PermitExcess, r.RWChecks, r.RWOverlaps, r.FenceDisorders, r.PrimDataLoss}
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.fail, r.Failed(), "violations: %q\nproblems: %q", r.Violations, r.Problems)
			assert.Zero(t, r.Acquisitions, "no mutex grants")
		})
	}
}

// TestCheckExplainsOverlap shows that a violation names both acquisitions, with their events.
func TestCheckExplainsOverlap(t *testing.T) {
	b := newHistory()
	a := b.grant(0, "x", 1, 0, 2, 600)
	c := b.grant(1, "x", 2, 100, 300, 600)
	b.ended(0, a, 590)
	b.released(1, c, 400)
	r := chaos.Check(&b.h, "")
	require.NotEmpty(t, r.Violations)
	v := r.Violations[0]
	for _, want := range []string{`overlap on "x"`, "w0.1 x fence 1", "w1.1 x fence 2", "t+300.000ms", "lease expired"} {
		assert.Contains(t, v, want)
	}
}

// TestResource checks the fenced resource's rule: a write is accepted when its fence is at
// least the highest accepted for its name, whatever other names do.
func TestResource(t *testing.T) {
	r := chaos.StartResource()
	defer r.Close()
	post := func(name string, fence uint64) string {
		t.Helper()
		resp, err := httpPost(fmt.Sprintf("%s/write?name=%s&fence=%d&token=t&seq=1", r.URL, name, fence))
		require.NoError(t, err)
		return resp
	}
	assert.Equal(t, "accepted", post("x", 5))
	assert.Equal(t, "accepted", post("x", 5))
	assert.Equal(t, "rejected", post("x", 4))
	assert.Equal(t, "accepted", post("y", 1))
	assert.Equal(t, "accepted", post("x", 6))
	var accepted []bool
	for _, w := range r.Log() {
		accepted = append(accepted, w.Accepted)
	}
	assert.Equal(t, []bool{true, true, false, true, true}, accepted)
}

// httpPost posts an empty body to url and returns the answer's body, on a connection of its
// own that it closes.
func httpPost(url string) (string, error) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Post(url, "text/plain", nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}
