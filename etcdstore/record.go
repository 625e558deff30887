package etcdstore

import (
	"encoding/binary"
	"errors"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// The keys of a Store: one per caller of a name, holder or waiter, all under one range.
//
//	<prefix><name> NUL <token>    the caller's record (see record), on one of its Store's leases
//
// A lock name holds no NUL byte (guard.CheckName), and neither does a token (the Store refuses
// one that does), so a name's keys form the range [<prefix><name> NUL, <prefix><name> \x01)
// that no other name's keys fall into, and a key says which name and token it is of.
//
// Among a name's keys, the one with the lowest create revision is the holder — the lock is
// held exactly while the name has a key — and the others wait behind it in create-revision
// order: first come, first served, across every process, by etcd's own order of writes. When
// the holder's key goes (released, its lease over, broken by an operator), the next key is the
// holder from that revision on: the name is handed to its first waiter without a write. The
// holder's create revision is the fence: every holder's is higher than the one's before it,
// because a key created later always gets a higher revision, and etcd's revision counter never
// goes back (deleting keys does not lower it).

// Kinds of record, the first byte of a key's value. A record whose value sorts below
// notKept is a live caller's (holding or waiting): a transaction tests that with one
// comparison of the value.
const (
	kindCaller byte = 'c' // a caller: the holder, or a waiter
	kindKept   byte = 'k' // a holder that released with a MinHold window left: no token matches it
	notKept         = "d" // every caller's record is below it, every kept one above
	recordV1   byte = 1   // the record's format
)

// record is what a key's value holds: who the caller is, for operators, and what a Guard that
// is handed the name needs to know of its lease.
type record struct {
	kind     byte
	at       time.Time     // when the caller's last request was sent, by its clock
	expires  time.Time     // when that request's lease (or place, or MinHold window) ends, by its clock
	ttl      time.Duration // the lease the caller asked for
	place    time.Duration // how long its last request kept its place in the queue; 0: it did not queue
	attempt  int           // the guard.Request.Attempt of its last request
	instance string
	label    string
	value    string // what the holder publishes (guard.Request.Value)
	shared   bool   // a shared hold (guard.Request.Shared)
	limit    int    // its limit (guard.Request.Limit); 0: none
}

// errBadRecord reports a value that is not a record of this package.
var errBadRecord = errors.New("etcdstore: a key under the prefix holds no lock record")

func (r record) encode() string {
	b := make([]byte, 0, 40+len(r.instance)+len(r.label)+len(r.value))
	b = append(b, r.kind, recordV1)
	b = binary.AppendVarint(b, r.at.UnixMilli())
	b = binary.AppendVarint(b, r.expires.UnixMilli())
	b = binary.AppendUvarint(b, uint64(r.ttl/time.Millisecond))
	b = binary.AppendUvarint(b, uint64(r.place/time.Millisecond))
	b = binary.AppendUvarint(b, uint64(max(r.attempt, 0)))
	b = binary.AppendUvarint(b, uint64(len(r.instance)))
	b = append(b, r.instance...)
	b = binary.AppendUvarint(b, uint64(len(r.label)))
	b = append(b, r.label...)
	// The value comes last, so that a record written before it existed reads as one
	// without a value.
	b = binary.AppendUvarint(b, uint64(len(r.value)))
	b = append(b, r.value...)
	if r.shared {
		b = append(b, 1)
		b = binary.AppendUvarint(b, uint64(max(r.limit, 0)))
	}
	return string(b)
}

func decodeRecord(v []byte) (record, error) {
	if len(v) < 2 || (v[0] != kindCaller && v[0] != kindKept) || v[1] != recordV1 {
		return record{}, errBadRecord
	}
	r := record{kind: v[0]}
	v = v[2:]
	bad := false
	varint := func() int64 {
		n, k := binary.Varint(v)
		if k <= 0 {
			bad = true
			return 0
		}
		v = v[k:]
		return n
	}
	uvarint := func() uint64 {
		n, k := binary.Uvarint(v)
		if k <= 0 {
			bad = true
			return 0
		}
		v = v[k:]
		return n
	}
	text := func() string {
		n := uvarint()
		if bad || n > uint64(len(v)) {
			bad = true
			return ""
		}
		s := string(v[:n])
		v = v[n:]
		return s
	}
	r.at = time.UnixMilli(varint())
	r.expires = time.UnixMilli(varint())
	r.ttl = time.Duration(uvarint()) * time.Millisecond
	r.place = time.Duration(uvarint()) * time.Millisecond
	r.attempt = int(uvarint())
	r.instance = text()
	r.label = text()
	if len(v) > 0 {
		r.value = text()
	}
	if len(v) > 0 && !bad {
		r.shared = v[0] == 1
		v = v[1:]
		r.limit = int(uvarint())
	}
	if bad {
		return record{}, errBadRecord
	}
	return r, nil
}

// handed is the lease a waiter gets when the name is handed to it: the one it asked for, but
// no longer than its place in the queue (see guard.Backend's Release).
func (r record) handed() time.Duration {
	if r.place > 0 {
		return min(r.ttl, r.place)
	}
	return r.ttl
}

// caller is one key of a name, read back.
type caller struct {
	key    string
	token  string
	create int64 // its create revision: the fence, when it holds the name
	mod    int64
	lease  int64
	rec    record
	kv     *mvccpb.KeyValue
}

// key returns the key of token's record for name.
func (s *Store) key(name, token string) string { return s.prefix + name + "\x00" + token }

// nameRange returns the range of name's keys: [start, end).
func (s *Store) nameRange(name string) (start, end string) {
	return s.prefix + name + "\x00", s.prefix + name + "\x01"
}

// split returns the name and token of key, a key of the Store.
func (s *Store) split(key string) (name, token string, ok bool) {
	rest, ok := strings.CutPrefix(key, s.prefix)
	if !ok {
		return "", "", false
	}
	name, token, ok = strings.Cut(rest, "\x00")
	return name, token, ok && name != "" && token != ""
}

// callerOf reads one key of the Store.
func (s *Store) callerOf(kv *mvccpb.KeyValue) (caller, error) {
	_, token, ok := s.split(string(kv.Key))
	if !ok {
		return caller{}, errBadRecord
	}
	rec, err := decodeRecord(kv.Value)
	if err != nil {
		return caller{}, err
	}
	return caller{key: string(kv.Key), token: token, create: kv.CreateRevision, mod: kv.ModRevision, lease: kv.Lease, rec: rec, kv: kv}, nil
}

// staysFor is how long the name stays taken by c, from now, as far as c's record tells: until
// the end its last request set, by its clock. A holder renewed since (a renewal writes no
// record) may keep the name up to its TTL from its last renewal: that is the answer once the
// record's end has passed. It is at least 1 ms: the key exists.
func (c caller) staysFor(now time.Time) time.Duration {
	if left := c.rec.expires.Sub(now); left > 0 {
		return left
	}
	if c.rec.kind == kindCaller && c.rec.ttl > 0 {
		return c.rec.ttl
	}
	return time.Millisecond
}
