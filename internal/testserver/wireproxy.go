package testserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// WireProxy is a MongoDB wire-protocol proxy that serializes write commands.
//
// FerretDB v1 runs findAndModify, update and delete as "query, then write" without isolation
// between the two, so two conditional updates of one document can both match it and both
// apply: 8 racers taking over one expired lock document got 2 to 8 winners per round. MongoDB
// guarantees that a single-document write is atomic, and every lock backend relies on it. The
// proxy restores that guarantee in front of FerretDB: it holds one semaphore from forwarding a
// write command until its reply has been read back, so at most one write is inside the server
// at a time (on all connections), while hello, find and the other read-only commands pass
// concurrently. With it, the same race had exactly one winner in every round.
//
// The proxy understands just enough of the protocol to do that:
//   - OP_MSG: the command is the first key of the body (kind 0) section. A request with the
//     moreToCome flag gets no reply from MongoDB, but FerretDB v1 answers it anyway; the proxy
//     clears the flag (and drops the checksum it covers), waits for the reply and swallows it,
//     so a fire-and-forget write is serialized too and the client never sees a stray reply.
//     Replies with moreToCome (exhaust cursors, streaming hello) are relayed until the last one.
//   - OP_QUERY, as drivers use it for the legacy hello of the connection handshake: the first
//     key of the query document, answered by one OP_REPLY.
//
// Anything else (OP_COMPRESSED, the pre-3.6 opcodes) closes the connection and is reported as a
// test error when the proxy closes: neither the driver nor FerretDB negotiates compression here.
type WireProxy struct {
	// Addr is the host:port the proxy listens on.
	Addr string

	upstream string
	ln       net.Listener
	writes   chan struct{} // semaphore: holds one token from forwarding a write until its reply
	done     chan struct{} // closed by Close
	wg       sync.WaitGroup

	serialized atomic.Int64 // write commands forwarded under the semaphore

	mu     sync.Mutex // protects conns and errs
	conns  map[net.Conn]struct{}
	errs   []error
	closed bool
}

// StartWireProxy starts a WireProxy on a free loopback port in front of the server at
// upstream and registers a cleanup that closes it.
func StartWireProxy(tb testing.TB, upstream string) *WireProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("testserver: wire proxy: listen: %v", err)
	}
	p := &WireProxy{
		Addr:     ln.Addr().String(),
		upstream: upstream,
		ln:       ln,
		writes:   make(chan struct{}, 1),
		done:     make(chan struct{}),
		conns:    make(map[net.Conn]struct{}),
	}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(func() {
		for _, err := range p.Close() {
			tb.Errorf("testserver: wire proxy: %v", err)
		}
	})
	return p
}

// Serialized returns how many write commands the proxy has forwarded one at a time.
func (p *WireProxy) Serialized() int64 { return p.serialized.Load() }

// Close stops accepting, closes every connection, waits for the proxy's goroutines and returns
// the protocol errors it met (requests it could not classify). It is safe to call more than
// once; later calls return nil.
func (p *WireProxy) Close() []error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	_ = p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.errs
}

func (p *WireProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			p.serve(c)
		}()
	}
}

// track registers c to be closed by Close; it closes c and reports false if Close came first.
func (p *WireProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *WireProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *WireProxy) fail(err error) {
	p.mu.Lock()
	p.errs = append(p.errs, err)
	p.mu.Unlock()
}

// serve relays one client connection, one request and its replies at a time: drivers never
// pipeline requests on a connection.
func (p *WireProxy) serve(client net.Conn) {
	up, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return // the server is gone: the client sees its connection closed
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)

	for {
		req, err := readWireMessage(client)
		if err != nil {
			return
		}
		r, err := classify(req)
		if err != nil {
			p.fail(err)
			return
		}
		if !p.roundTrip(client, up, req, r) {
			return
		}
	}
}

// roundTrip forwards req and relays its replies; it reports false when the connection is done.
func (p *WireProxy) roundTrip(client, up net.Conn, req []byte, r request) bool {
	if r.write {
		select {
		case p.writes <- struct{}{}:
		case <-p.done:
			return false
		}
		p.serialized.Add(1)
	}
	held := r.write
	release := func() {
		if held {
			<-p.writes
			held = false
		}
	}
	defer release()

	swallow := false
	if r.moreToCome {
		req = clearMoreToCome(req)
		swallow = true
	}
	if _, err := up.Write(req); err != nil {
		return false
	}
	for {
		reply, err := readWireMessage(up)
		if err != nil {
			return false
		}
		release() // the write is done once its (first) reply is back
		if !swallow {
			if _, err := client.Write(reply); err != nil {
				return false
			}
		}
		if !replyHasMoreToCome(reply) {
			return true
		}
	}
}

// Wire protocol constants (MongoDB wire protocol reference).
const (
	opQuery      = 2004
	opCompressed = 2012
	opMsg        = 2013

	flagChecksumPresent = 1 << 0
	flagMoreToCome      = 1 << 1

	headerLen = 16
	// maxWireMessage is MongoDB's maxMessageSizeBytes.
	maxWireMessage = 48_000_000
)

// readWireMessage reads one whole message: header and body.
func readWireMessage(r io.Reader) ([]byte, error) {
	var hdr [headerLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int(int32(binary.LittleEndian.Uint32(hdr[0:4])))
	if n < headerLen || n > maxWireMessage {
		return nil, fmt.Errorf("message length %d out of range", n)
	}
	msg := make([]byte, n)
	copy(msg, hdr[:])
	if _, err := io.ReadFull(r, msg[headerLen:]); err != nil {
		return nil, err
	}
	return msg, nil
}

// request is what the proxy needs to know about a request.
type request struct {
	command    string
	write      bool // serialize it
	moreToCome bool // OP_MSG that expects no reply
}

// readOnlyCommands pass the proxy concurrently; every other command is serialized. Unknown
// commands count as writes: serializing a read only costs latency, letting a write through
// would cost atomicity.
var readOnlyCommands = map[string]bool{
	"hello": true, "isMaster": true, "ismaster": true, "ping": true,
	"buildInfo": true, "buildinfo": true, "getParameter": true, "getCmdLineOpts": true,
	"hostInfo": true, "serverStatus": true, "connectionStatus": true, "whatsmyuri": true,
	"getLog": true, "listCommands": true,
	"saslStart": true, "saslContinue": true, "authenticate": true, "getnonce": true, "logout": true,
	"find": true, "getMore": true, "killCursors": true, "count": true, "distinct": true,
	"listCollections": true, "listDatabases": true, "listIndexes": true,
	"dbStats": true, "collStats": true, "dataSize": true, "explain": true,
	"endSessions": true,
}

func classify(msg []byte) (request, error) {
	opCode := int32(binary.LittleEndian.Uint32(msg[12:16]))
	var (
		r   request
		err error
	)
	switch opCode {
	case opMsg:
		r, err = classifyMsg(msg)
	case opQuery:
		r, err = classifyQuery(msg)
	case opCompressed:
		err = errors.New("OP_COMPRESSED request: compression is not supported by the proxy")
	default:
		err = fmt.Errorf("unsupported opcode %d", opCode)
	}
	if err != nil {
		return r, err
	}
	r.write = !readOnlyCommands[r.command]
	return r, nil
}

// classifyMsg reads an OP_MSG: flagBits, then sections; the command is the first key of the
// kind-0 section's document.
func classifyMsg(msg []byte) (request, error) {
	if len(msg) < headerLen+4 {
		return request{}, errors.New("short OP_MSG")
	}
	flags := binary.LittleEndian.Uint32(msg[16:20])
	end := len(msg)
	if flags&flagChecksumPresent != 0 {
		end -= 4
	}
	r := request{moreToCome: flags&flagMoreToCome != 0}
	for i := headerLen + 4; i < end; {
		kind := msg[i]
		i++
		if i+4 > end {
			return r, errors.New("truncated OP_MSG section")
		}
		size := int(int32(binary.LittleEndian.Uint32(msg[i : i+4])))
		if size < 5 || i+size > end {
			return r, errors.New("bad OP_MSG section size")
		}
		switch kind {
		case 0:
			name, err := firstKey(msg[i : i+size])
			if err != nil {
				return r, err
			}
			r.command = name
			return r, nil
		case 1:
			i += size
		default:
			return r, fmt.Errorf("unknown OP_MSG section kind %d", kind)
		}
	}
	return r, errors.New("OP_MSG without a body section")
}

// classifyQuery reads an OP_QUERY: flags, fullCollectionName, numberToSkip, numberToReturn,
// query document.
func classifyQuery(msg []byte) (request, error) {
	i := headerLen + 4
	nul := strings.IndexByte(string(msg[i:]), 0)
	if nul < 0 {
		return request{}, errors.New("OP_QUERY without a collection name")
	}
	i += nul + 1 + 8
	if i > len(msg) {
		return request{}, errors.New("short OP_QUERY")
	}
	name, err := firstKey(msg[i:])
	return request{command: name}, err
}

// firstKey returns the name of the first element of the BSON document at the start of doc.
func firstKey(doc []byte) (string, error) {
	// int32 length, then elements: type byte, cstring name, value; a document ends with 0.
	if len(doc) < 5 {
		return "", errors.New("short BSON document")
	}
	if doc[4] == 0 {
		return "", errors.New("empty command document")
	}
	nul := strings.IndexByte(string(doc[5:]), 0)
	if nul < 0 {
		return "", errors.New("unterminated BSON key")
	}
	return string(doc[5 : 5+nul]), nil
}

// clearMoreToCome returns a copy of the OP_MSG msg without the moreToCome flag and without its
// checksum, which would no longer match.
func clearMoreToCome(msg []byte) []byte {
	flags := binary.LittleEndian.Uint32(msg[16:20])
	n := len(msg)
	if flags&flagChecksumPresent != 0 {
		n -= 4
	}
	out := make([]byte, n)
	copy(out, msg[:n])
	binary.LittleEndian.PutUint32(out[0:4], uint32(n))
	binary.LittleEndian.PutUint32(out[16:20], flags&^(flagMoreToCome|flagChecksumPresent))
	return out
}

// replyHasMoreToCome reports whether reply is an OP_MSG that another reply follows without a
// request (exhaust).
func replyHasMoreToCome(reply []byte) bool {
	if int32(binary.LittleEndian.Uint32(reply[12:16])) != opMsg || len(reply) < headerLen+4 {
		return false
	}
	return binary.LittleEndian.Uint32(reply[16:20])&flagMoreToCome != 0
}
