package testserver

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// FaultProxy is a TCP proxy between clients and one server that injects network faults the
// test switches on and off while it runs: latency per direction, the loss or delay of the
// reply to one chosen request, a partition (blackhole), and reset or refused connections.
// Point the client at Addr instead of the server. It relays any TCP protocol; the faults
// that pick a request need a match function for it. All methods are safe for concurrent use.
//
// Requests are recognised by a match function that sees one chunk of bytes as read from a
// client connection (one read call), not a parsed message: a request a client sends in one
// write usually arrives as one chunk on loopback, and a pipeline as one chunk holding several
// requests. MatchCommand and MatchEvalSha build match functions for Redis (RESP),
// MatchMongoCommand for the MongoDB wire protocol. The reply-side faults act on what the
// server sends next on that connection, so they fit clients that wait for a reply before
// they send the next request on a connection, as go-redis does.
//
// The proxy dials the server once per client connection, when the client connects, and
// relays each direction in order. A connection ends, on both sides, when either side closes
// it (after what the server had sent is relayed) or a fault cuts it.
type FaultProxy struct {
	// Addr is the host:port the proxy listens on.
	Addr string

	upstream string
	ln       net.Listener
	wg       sync.WaitGroup // the accept loop and every connection's goroutines

	toServer, toClient atomic.Int64 // latency per direction, in nanoseconds
	blackholed         atomic.Bool
	// isolated, when set, picks the connections a partial blackhole cuts, by their first
	// chunk from the client (BlackholeConns).
	isolated atomic.Pointer[func(first []byte) bool]
	refusing atomic.Bool
	stats    proxyCounters

	mu     sync.Mutex // protects conns, faults and closed
	conns  map[*proxyConn]struct{}
	faults []*Fault // armed, in the order they were armed
	closed bool
}

// ProxyStats are a FaultProxy's counters since it started.
type ProxyStats struct {
	Conns     int64 // client connections accepted and relayed
	Active    int   // of those, still open
	Refused   int64 // client connections reset at once while refusing (Refuse)
	Reset     int64 // connections reset by Reset, and by Heal (those that lost bytes)
	Dropped   int64 // replies swallowed by DropReply faults
	Delayed   int64 // replies held and then relayed by DelayReply faults
	Discarded int64 // chunks discarded in a blackhole, both directions
}

// proxyCounters are the atomic counters behind ProxyStats.
type proxyCounters struct {
	conns, refused, reset, dropped, delayed, discarded atomic.Int64
}

// StartFaultProxy starts a FaultProxy on a free loopback port in front of the server at
// upstream, with no fault on, and registers a cleanup that closes it.
func StartFaultProxy(tb testing.TB, upstream string) *FaultProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("testserver: fault proxy: listen: %v", err)
	}
	p := &FaultProxy{
		Addr:     ln.Addr().String(),
		upstream: upstream,
		ln:       ln,
		conns:    make(map[*proxyConn]struct{}),
	}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.Close)
	return p
}

// Close stops accepting, closes every connection and waits until all the proxy's
// goroutines have returned. Armed faults never fire. It is safe to call more than once.
func (p *FaultProxy) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		_ = p.ln.Close()
		for c := range p.conns {
			c.cut(false)
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// SetLatency delays every chunk of bytes by toServer on its way from the client to the
// server and by toClient on its way back, from when the proxy read it; zero turns latency
// off. Chunks keep their order, and a connection's throughput is not limited: chunks read
// together arrive together. It applies to chunks still in flight.
func (p *FaultProxy) SetLatency(toServer, toClient time.Duration) {
	p.toServer.Store(int64(toServer))
	p.toClient.Store(int64(toClient))
}

// Blackhole partitions the clients from the server: from now until Heal, every byte in
// either direction is discarded, as if the network lost it — nothing is delivered late
// after Heal. Connections stay open, and new ones are accepted but carry nothing, so a
// client that waits for a reply waits until its own timeout.
func (p *FaultProxy) Blackhole() { p.blackholed.Store(true) }

// BlackholeConns partitions only the connections whose first chunk of bytes from the client
// match accepts — a connection whose client said nothing yet is not one of them — as Blackhole
// does all of them, until Heal. It serves protocols whose connections open with a request
// that says who dials, such as the peer traffic of a consensus cluster (etcd's peers name
// themselves in an X-Server-From header): then one peer can be cut off from the others on the
// proxies in front of them. A later call replaces the choice; connections that lost bytes to
// the earlier one stay cut until Heal resets them.
func (p *FaultProxy) BlackholeConns(match func(first []byte) bool) { p.isolated.Store(&match) }

// Heal ends a Blackhole and a BlackholeConns: bytes read from now on are relayed again, on new
// connections and on those that were open but idle during the partition. A connection that
// lost bytes to the partition is reset instead, and relays nothing more in the meantime: TCP
// never delivers a stream with a hole in it — across a real partition it retransmits until
// the connection times out — and protocols that encode a message relative to the one before
// (etcd's raft stream does) would read the bytes after a hole as garbage.
func (p *FaultProxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackholed.Store(false)
	p.isolated.Store(nil)
	for c := range p.conns {
		if c.torn.Load() && c.cut(true) {
			p.stats.reset.Add(1)
		}
	}
}

// Reset closes every open connection with a TCP RST (SO_LINGER 0) on both sides: its
// client and the server see "connection reset". New connections are accepted as before,
// unless Refuse is on.
func (p *FaultProxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if c.cut(true) {
			p.stats.reset.Add(1)
		}
	}
}

// Refuse makes the proxy reset every new connection as soon as it is accepted, until Allow:
// the client's dial, or its first read or write, fails with "connection reset" (the proxy
// keeps listening, so that no other process can take the port). Open connections are left
// alone: Reset them too for a server that went away.
func (p *FaultProxy) Refuse() { p.refusing.Store(true) }

// Allow ends Refuse: new connections are relayed again.
func (p *FaultProxy) Allow() { p.refusing.Store(false) }

// Fault is a one-shot fault armed on a FaultProxy: the first request chunk, on any
// connection, that its match function accepts triggers it, and no later one.
type Fault struct {
	match   func(request []byte) bool
	drop    bool          // DropReply; DelayReply otherwise
	delay   time.Duration // for DelayReply
	matched chan struct{}
	done    chan struct{}
	once    sync.Once // closes done
}

// Matched is closed when a request has matched, as it is forwarded to the server.
func (f *Fault) Matched() <-chan struct{} { return f.matched }

// Done is closed when the fault has happened: for DropReply, the server's reply was
// swallowed and the connection cut; for DelayReply, the held reply was relayed.
func (f *Fault) Done() <-chan struct{} { return f.done }

func (f *Fault) finish() { f.once.Do(func() { close(f.done) }) }

// DropReply arms a fault that loses the reply to one request: the first request chunk that
// match accepts is forwarded to the server, which runs it; then whatever the server sends
// back on that connection is swallowed, and the connection is cut (RST on both sides) as
// soon as the first bytes of it arrive. The client sees its connection end (EOF or
// "connection reset"), never the reply: the command ran, and the client cannot tell whether
// it did.
//
// match is called with the proxy's lock held, for chunks of every connection: it must be
// quick and must not call the proxy.
func (p *FaultProxy) DropReply(match func(request []byte) bool) *Fault {
	return p.arm(&Fault{match: match, drop: true})
}

// DelayReply arms a fault that holds the reply to one request for d: the first request
// chunk that match accepts is forwarded at once, and what the server sends back next on
// that connection is relayed d after it arrived (plus any latency). Later replies on that
// connection wait behind it; other connections flow as usual.
func (p *FaultProxy) DelayReply(match func(request []byte) bool, d time.Duration) *Fault {
	return p.arm(&Fault{match: match, delay: d})
}

func (p *FaultProxy) arm(f *Fault) *Fault {
	f.matched, f.done = make(chan struct{}), make(chan struct{})
	p.mu.Lock()
	p.faults = append(p.faults, f)
	p.mu.Unlock()
	return f
}

// Stats returns the proxy's counters.
func (p *FaultProxy) Stats() ProxyStats {
	p.mu.Lock()
	active := len(p.conns)
	p.mu.Unlock()
	return ProxyStats{
		Conns:     p.stats.conns.Load(),
		Active:    active,
		Refused:   p.stats.refused.Load(),
		Reset:     p.stats.reset.Load(),
		Dropped:   p.stats.dropped.Load(),
		Delayed:   p.stats.delayed.Load(),
		Discarded: p.stats.discarded.Load(),
	}
}

func (p *FaultProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		if p.refusing.Load() {
			p.stats.refused.Add(1)
			resetConn(client)
			continue
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

// serve dials the server for client and relays the connection until it ends.
func (p *FaultProxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.upstream)
	if err != nil {
		resetConn(client) // the server is gone: the client sees its connection reset
		return
	}
	c := &proxyConn{p: p, client: client, server: server, closed: make(chan struct{})}
	if !p.track(c) {
		return
	}
	p.stats.conns.Add(1)
	toServer, toClient := make(chan chunk, 64), make(chan chunk, 64)
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); c.read(client, toServer, false) }()
	go func() { defer wg.Done(); c.write(server, toServer, true) }()
	go func() { defer wg.Done(); c.read(server, toClient, true) }()
	go func() { defer wg.Done(); c.write(client, toClient, false) }()
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// track registers c to be cut by Close; it cuts c and reports false if Close came first.
func (p *FaultProxy) track(c *proxyConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.cut(false)
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

// take removes and returns the first armed fault that matches request, or nil.
func (p *FaultProxy) take(request []byte) *Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, f := range p.faults {
		if f.match(request) {
			p.faults = append(p.faults[:i:i], p.faults[i+1:]...)
			return f
		}
	}
	return nil
}

// proxyConn is one relayed connection: two sockets and, per direction, a reader goroutine
// that stamps chunks and a writer goroutine that delivers them when due.
type proxyConn struct {
	p              *FaultProxy
	client, server net.Conn

	closeOnce sync.Once
	closed    chan struct{} // closed by cut

	mu    sync.Mutex // protects reply
	reply *Fault     // armed on this connection: acts on the next bytes from the server

	first atomic.Pointer[[]byte] // the first chunk from the client, for BlackholeConns
	torn  atomic.Bool            // bytes were discarded in a partition: relay nothing more (Heal)
}

// firstChunkKept bounds how much of a connection's first chunk BlackholeConns sees.
const firstChunkKept = 4 << 10

// blackholed reports whether c's bytes are to be discarded now: a partition holds it, or one
// did and discarded some of its bytes already. Discarding marks c torn. A connection marked
// torn just as Heal ran — after Heal looked for torn ones — is reset here: either Heal sees
// the mark, or this sees the partition over.
func (c *proxyConn) blackholed() bool {
	if c.torn.Load() {
		return true
	}
	if !c.partitioned() {
		return false
	}
	if beforeTorn != nil {
		beforeTorn(c.p)
	}
	c.torn.Store(true)
	if !c.partitioned() && c.cut(true) {
		c.p.stats.reset.Add(1)
	}
	return true
}

// beforeTorn, when set by a test, runs between a connection's finding itself partitioned and
// its marking itself torn: where a Heal can slip in.
var beforeTorn func(p *FaultProxy)

// partitioned reports whether a partition holds c now.
func (c *proxyConn) partitioned() bool {
	if c.p.blackholed.Load() {
		return true
	}
	match := c.p.isolated.Load()
	if match == nil {
		return false
	}
	first := c.first.Load()
	return first != nil && (*match)(*first)
}

// chunk is what one read returned, stamped with when it was read.
type chunk struct {
	b    []byte
	at   time.Time
	hold *Fault // a DelayReply fault holding this chunk
}

// cut closes both sockets (with RST when rst is set) and ends the relay; it reports
// whether this call did it.
func (c *proxyConn) cut(rst bool) bool {
	did := false
	c.closeOnce.Do(func() {
		did = true
		if rst {
			resetConn(c.client)
			resetConn(c.server)
		} else {
			_ = c.client.Close()
			_ = c.server.Close()
		}
		close(c.closed)
	})
	return did
}

// read reads chunks from src and queues them for the writer until src ends. fromServer
// tells which side src is: replies are where armed faults act.
func (c *proxyConn) read(src net.Conn, out chan<- chunk, fromServer bool) {
	defer close(out)
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			ch := chunk{b: buf[:n], at: time.Now()}
			if !fromServer && c.first.Load() == nil {
				first := append([]byte(nil), buf[:min(n, firstChunkKept)]...)
				c.first.Store(&first)
			}
			switch {
			case c.blackholed():
				c.p.stats.discarded.Add(1)
				ch.b = nil
			case fromServer:
				if f := c.takeReplyFault(); f != nil {
					if f.drop {
						c.p.stats.dropped.Add(1)
						c.cut(true)
						f.finish()
						return
					}
					ch.hold = f
				}
			}
			if ch.b != nil {
				select {
				case out <- ch:
				case <-c.closed:
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// write delivers queued chunks to dst when they are due, until the reader is done (then it
// cuts the connection) or the connection is cut. toServer tells the direction.
func (c *proxyConn) write(dst net.Conn, in <-chan chunk, toServer bool) {
	defer c.cut(false)
	for ch := range in {
		lat := c.p.toClient.Load()
		if toServer {
			lat = c.p.toServer.Load()
		}
		due := ch.at.Add(time.Duration(lat))
		if ch.hold != nil {
			due = due.Add(ch.hold.delay)
		}
		if wait := time.Until(due); wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-c.closed:
				timer.Stop()
				return
			}
		}
		if c.blackholed() {
			c.p.stats.discarded.Add(1)
			continue
		}
		if toServer {
			if f := c.armReplyFault(ch.b); f != nil {
				close(f.matched)
			}
		}
		if _, err := dst.Write(ch.b); err != nil {
			return
		}
		if ch.hold != nil {
			c.p.stats.delayed.Add(1)
			ch.hold.finish()
		}
	}
}

// armReplyFault takes the proxy's first armed fault that matches request, if this
// connection has none armed yet, and arms it here: before the request is forwarded, so
// before its reply can come back.
func (c *proxyConn) armReplyFault(request []byte) *Fault {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reply != nil {
		return nil
	}
	c.reply = c.p.take(request)
	return c.reply
}

func (c *proxyConn) takeReplyFault() *Fault {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.reply
	c.reply = nil
	return f
}

// resetConn closes conn with a TCP RST instead of a FIN.
func resetConn(conn net.Conn) {
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = conn.Close()
}
