package middleware

import (
	"bytes"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"
)

// A request body is read whole before the lock is taken, so that the lock is never held for
// a client that is still sending (see MaxBodyBytes): what a handler behind the middleware
// reads comes from memory.

// body is a request body read into memory.
type body []byte

// readBody reads r's body, within MaxBodyBytes and BodyTimeout, and returns the request to
// serve — a copy of r whose body is in memory — and the body. When the body cannot be read it
// answers the request itself (413, 408 or 400; clientLeft when the client left) and returns a
// nil request. A request without a body, or a middleware with StreamBody, is served as it is.
func (m *locker) readBody(w http.ResponseWriter, r *http.Request) (*http.Request, body) {
	if m.cfg.streamBody {
		r = r.WithContext(r.Context()) // a copy: the caller's request is not changed
		readAhead(r)
		return r, nil
	}
	if r.Body == nil || r.Body == http.NoBody {
		return r, nil
	}
	limit := m.cfg.maxBody
	if r.ContentLength > limit {
		m.tooLarge(w)
		return nil, nil
	}
	stop := m.bodyDeadline(w)
	b, err := io.ReadAll(io.LimitReader(r.Body, readLimit(limit)))
	expired := stop()
	switch {
	case expired || isTimeout(err):
		if r.ProtoMajor == 1 {
			// The rest of the body may still come: the connection cannot carry another
			// request. HTTP/2 ends the stream alone; there, Connection: close would make
			// the server close the connection and every other stream on it.
			w.Header().Set("Connection", "close")
		}
		writeProblem(w, http.StatusRequestTimeout, "The request body did not arrive in time.")
		return nil, nil
	case err != nil && pastDeadline(r.Context()):
		timeUp(w)
		return nil, nil
	case err != nil && r.Context().Err() != nil:
		clientLeft(w, r)
		return nil, nil
	case errors.As(err, new(*http.MaxBytesError)) || err == nil && int64(len(b)) > limit:
		m.tooLarge(w)
		return nil, nil
	case err != nil:
		writeProblem(w, http.StatusBadRequest, "The request body could not be read.")
		return nil, nil
	}
	r = r.WithContext(r.Context()) // a copy: the caller's request is not changed
	r.ContentLength = int64(len(b))
	r.GetBody = func() (io.ReadCloser, error) { return body(b).reader(), nil }
	body(b).rewind(r)
	return r, b
}

// readLimit is how much of a body the middleware reads with MaxBodyBytes(limit): one byte
// more than the limit, to tell a body over it; the whole body when the limit is as large as
// an int64 goes (math.MaxInt64, where limit+1 would be negative and read nothing).
func readLimit(limit int64) int64 {
	if limit == math.MaxInt64 {
		return limit
	}
	return limit + 1
}

// reader returns a reader of b from its start.
func (b body) reader() io.ReadCloser {
	if len(b) == 0 {
		return http.NoBody
	}
	return io.NopCloser(bytes.NewReader(b))
}

// rewind makes r's body b again from its start, when b was read into memory.
func (b body) rewind(r *http.Request) {
	if b != nil {
		r.Body = b.reader()
	}
}

// tooLarge answers a request whose body is larger than MaxBodyBytes.
func (m *locker) tooLarge(w http.ResponseWriter) {
	writeProblem(w, http.StatusRequestEntityTooLarge,
		"The request body is larger than this resource accepts ("+strconv.FormatInt(m.cfg.maxBody, 10)+" bytes).")
}

// bodyDeadline bounds the read of a body by BodyTimeout: when the time is up, it moves the
// connection's read deadline to now, which ends a read that waits. It returns stop, to call
// once the read is over, which reports whether the time was up first.
func (m *locker) bodyDeadline(w http.ResponseWriter) (stop func() (expired bool)) {
	d := m.cfg.bodyTimeout
	if d <= 0 {
		return func() bool { return false }
	}
	rc := http.NewResponseController(w)
	var mu sync.Mutex // protects done and expired: the deadline is never moved after stop
	done, expired := false, false
	t := time.AfterFunc(d, func() {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			// A writer that cannot move deadlines leaves the bound to the server.
			expired = rc.SetReadDeadline(time.Now()) == nil
		}
	})
	return func() bool {
		t.Stop()
		mu.Lock()
		defer mu.Unlock()
		done = true
		return expired
	}
}

// isTimeout reports whether err is a read deadline that passed: BodyTimeout's or the
// server's ReadTimeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// streamAhead is how much of a StreamBody request's body the middleware reads ahead while the
// request waits for its lock.
const streamAhead = 64 << 10

// aheadBody is the body of a StreamBody request over HTTP/1, read ahead while the request
// waits. net/http notices that an HTTP/1 client hung up only when it reads from the
// connection: a goroutine reading the body — up to streamAhead bytes, or to its end, after
// which net/http's own background read watches the connection — makes it notice, and cancel
// the request's context, which ends the wait; the handler of a request whose client left is
// then not called. The handler reads what was read ahead, then the rest of the body as it
// comes: the goroutine stops at its next read once the handler has read.
type aheadBody struct {
	src io.ReadCloser

	mu      sync.Mutex
	changed *sync.Cond // signalled when buf, err or reading change
	buf     []byte     // read ahead, not yet read by the handler
	err     error      // the error that ended the read-ahead (io.EOF at the end)
	reading bool       // the goroutine is reading
	handed  bool       // the handler has begun to read: the goroutine stops
}

// readAhead replaces r's body, a StreamBody request's over HTTP/1, by one read ahead.
func readAhead(r *http.Request) {
	if r.ProtoMajor != 1 || r.Body == nil || r.Body == http.NoBody {
		return // HTTP/2 notices a client that left by itself
	}
	b := &aheadBody{src: r.Body, reading: true}
	b.changed = sync.NewCond(&b.mu)
	r.Body = b
	go b.run()
}

func (b *aheadBody) run() {
	chunk := make([]byte, 4<<10)
	for {
		b.mu.Lock()
		if b.handed || len(b.buf) >= streamAhead {
			b.reading = false
			b.changed.Broadcast()
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		n, err := b.src.Read(chunk)
		b.mu.Lock()
		b.buf = append(b.buf, chunk[:n]...)
		if err != nil {
			b.err, b.reading = err, false
		}
		b.changed.Broadcast()
		b.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// Read returns what was read ahead, then reads the body itself.
func (b *aheadBody) Read(p []byte) (int, error) {
	return b.read(p, true)
}

// read is Read; without hand, it leaves the read-ahead going, for LockFunc's key reads before
// the request waits.
func (b *aheadBody) read(p []byte, hand bool) (int, error) {
	b.mu.Lock()
	b.handed = b.handed || hand
	for len(b.buf) == 0 && b.reading {
		b.changed.Wait()
	}
	if len(b.buf) > 0 {
		n := copy(p, b.buf)
		b.buf = b.buf[n:]
		b.mu.Unlock()
		return n, nil
	}
	err := b.err
	b.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return b.src.Read(p)
}

// Close stops the read-ahead at its next read and closes the body.
func (b *aheadBody) Close() error {
	b.stop()
	return b.src.Close()
}

// stop ends the read-ahead at its next read: the request is answered, or its handler runs.
func (b *aheadBody) stop() {
	b.mu.Lock()
	b.handed = true
	b.mu.Unlock()
}

// keyBody is a StreamBody request's body while LockFunc's key reads it: it keeps what the key
// reads, which the handler then reads again before the rest of the body (replay). Over
// HTTP/1 the key reads what was read ahead, and the read-ahead goes on while the request
// waits.
type keyBody struct {
	src  io.ReadCloser
	read []byte
}

// recordKeyRead makes r's body, a StreamBody request's, a keyBody, for LockFunc's key.
func recordKeyRead(r *http.Request) *keyBody {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	k := &keyBody{src: r.Body}
	r.Body = k
	return k
}

func (k *keyBody) Read(p []byte) (n int, err error) {
	if ab, ok := k.src.(*aheadBody); ok {
		n, err = ab.read(p, false)
	} else {
		n, err = k.src.Read(p)
	}
	k.read = append(k.read, p[:n]...)
	return n, err
}

// Close leaves the body to the handler: the key does not end it.
func (k *keyBody) Close() error { return nil }

// replay makes r's body what the key read, then the rest of the body.
func (k *keyBody) replay(r *http.Request) {
	if k == nil {
		return
	}
	if len(k.read) == 0 {
		r.Body = k.src
		return
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(k.read), k.src), k.src}
}
