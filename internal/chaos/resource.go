package chaos

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"
)

// Resource is the shared resource the workers' locks protect: a tiny HTTP endpoint on
// loopback that takes fenced writes. It accepts a write for a name only if its fence is at
// least the highest fence it has accepted for that name — the check a real resource makes
// with a version column or a conditional write — and logs every write, accepted or not, with
// the time it was judged (its arrival, after any delay SetSlow adds).
//
// A write is POST /write?name=…&fence=…&token=…&seq=…; the answer is 200 with "accepted",
// 409 with "rejected", or 400 for a malformed request.
type Resource struct {
	// URL is the endpoint's base URL.
	URL string

	srv     *httptest.Server
	closing chan struct{} // closed by Close: ends the delays of writes in flight

	mu   sync.Mutex // protects high, log and slow
	high map[string]uint64
	log  []Write
	// slow, when positive, is the longest a write is held before it is judged: a slow
	// network between the workers and the resource, so that a write sent under a valid lock
	// can arrive after the next holder's.
	slow time.Duration
	rng  *rand.Rand // picks each write's delay while slow; under mu
}

// StartResource starts a Resource on a free loopback port. Close stops it.
func StartResource() *Resource {
	r := &Resource{high: make(map[string]uint64), rng: rand.New(rand.NewPCG(1, 2)), closing: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	r.URL = r.srv.URL
	return r
}

// Close stops the endpoint and waits for the requests in flight.
func (r *Resource) Close() {
	close(r.closing)
	r.srv.Close()
}

// Log returns the writes that arrived so far, in arrival order.
func (r *Resource) Log() []Write {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Write(nil), r.log...)
}

func (r *Resource) serve(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	fence, err1 := strconv.ParseUint(q.Get("fence"), 10, 64)
	seq, err2 := strconv.Atoi(q.Get("seq"))
	name, token := q.Get("name"), q.Get("token")
	if req.Method != http.MethodPost || req.URL.Path != "/write" || err1 != nil || err2 != nil || name == "" || token == "" {
		http.Error(w, "bad write", http.StatusBadRequest)
		return
	}
	if d := r.delay(); d > 0 {
		// A write in flight arrives even when its sender stopped waiting for the answer: the
		// wait does not follow the request's context.
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.closing:
			t.Stop()
			return
		}
	}
	ok := r.write(name, token, fence, seq)
	if !ok {
		w.WriteHeader(http.StatusConflict)
		fmt.Fprint(w, "rejected")
		return
	}
	fmt.Fprint(w, "accepted")
}

// SetSlow delays every write arriving from now on by a random time up to d before it is
// judged; 0 turns the delay off.
func (r *Resource) SetSlow(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.slow = d
}

// delay returns how long to hold the write that just arrived.
func (r *Resource) delay() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.slow <= 0 {
		return 0
	}
	return time.Duration(r.rng.Int64N(int64(r.slow)))
}

// write decides and logs one write. The arrival time is read under the lock, so that the log
// is in the order the decisions were made.
func (r *Resource) write(name, token string, fence uint64, seq int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ok := fence >= r.high[name]
	if ok {
		r.high[name] = fence
	}
	r.log = append(r.log, Write{
		Name: name, Fence: fence, Token: token, Seq: seq, Arrival: time.Now().UnixNano(), Accepted: ok,
	})
	return ok
}
