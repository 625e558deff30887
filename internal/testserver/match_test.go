package testserver

import (
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// resp encodes a command as a client sends it: an array of bulk strings.
func resp(args ...string) string {
	var b strings.Builder
	b.WriteString("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b.WriteString("$" + strconv.Itoa(len(a)) + "\r\n" + a + "\r\n")
	}
	return b.String()
}

func TestMatchCommand(t *testing.T) {
	tests := []struct {
		name    string
		match   func([]byte) bool
		request string
		want    bool
	}{
		{"name", MatchCommand("INCR"), resp("INCR", "k"), true},
		{"name in another case", MatchCommand("incr"), resp("InCr", "k"), true},
		{"other command", MatchCommand("INCR"), resp("GET", "k"), false},
		{"first argument", MatchCommand("SET", "k"), resp("SET", "k", "v"), true},
		{"other first argument", MatchCommand("SET", "k"), resp("SET", "kk", "v"), false},
		{"arguments compare exactly", MatchCommand("SET", "K"), resp("SET", "k", "v"), false},
		{"too few arguments", MatchCommand("SET", "k", "v", "NX"), resp("SET", "k", "v"), false},
		{"argument holding CRLF", MatchCommand("SET", "a\r\nb"), resp("SET", "a\r\nb", "v"), true},
		{"second command of a pipeline", MatchCommand("INCR"), resp("GET", "k") + resp("INCR", "k"), true},
		{"inside MULTI EXEC", MatchCommand("INCR"), resp("MULTI") + resp("INCR", "k") + resp("EXEC"), true},
		{"incomplete command", MatchCommand("INCR"), resp("INCR", "k")[:10], false},
		{"after an incomplete command", MatchCommand("INCR"), resp("GET", "k")[:8] + resp("INCR", "k"), false},
		{"inline command", MatchCommand("INCR"), "INCR k\r\n", false},
		{"empty", MatchCommand("INCR"), "", false},
		{"bad length", MatchCommand("INCR"), "*1\r\n$99\r\nINCR\r\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.match([]byte(tt.request)))
		})
	}
}

func TestMatchEvalSha(t *testing.T) {
	script := "return redis.call('GET', KEYS[1])"
	sum := sha1.Sum([]byte(script))
	sha := hex.EncodeToString(sum[:])
	other := strings.Repeat("0", 40)
	tests := []struct {
		name    string
		request string
		want    bool
	}{
		{"EVALSHA", resp("EVALSHA", sha, "1", "k"), true},
		{"EVALSHA upper-case hex", resp("evalsha", strings.ToUpper(sha), "1", "k"), true},
		{"EVALSHA_RO", resp("EVALSHA_RO", sha, "1", "k"), true},
		{"EVALSHA of another script", resp("EVALSHA", other, "1", "k"), false},
		{"EVAL of the script", resp("EVAL", script, "1", "k"), true},
		{"EVAL of another script", resp("EVAL", "return 1", "0"), false},
		{"in a pipeline", resp("PING") + resp("EVALSHA", sha, "0"), true},
		{"the SHA as a plain argument", resp("SET", sha, "v"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, MatchEvalSha(sha)([]byte(tt.request)))
		})
	}
}

func TestMatchMongoCommand(t *testing.T) {
	cmd := func(name string) bson.D { return bson.D{{Key: name, Value: "c"}, {Key: "$db", Value: "d"}} }
	update := buildOpMsg(t, 0, cmd("update"))
	find := buildOpMsg(t, 0, cmd("find"))
	tests := []struct {
		name    string
		request []byte
		want    bool
	}{
		{"the command", update, true},
		{"another command", find, false},
		{"second message of the chunk", append(append([]byte{}, find...), update...), true},
		{"incomplete message", update[:len(update)-1], false},
		{"legacy hello", buildOpQuery(t, "admin.$cmd", bson.D{{Key: "update", Value: 1}}), true},
		{"not a message", []byte("*1\r\n$4\r\nPING\r\n"), false},
		{"empty", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, MatchMongoCommand("update")(tt.request))
		})
	}
}

func TestMatchPostgresQuery(t *testing.T) {
	msg := func(kind byte, body string) string {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(4+len(body)))
		return string(kind) + string(n[:]) + body
	}
	bind, execute, sync := msg('B', "\x00stmt\x00\x00\x00\x00\x00\x00\x00"), msg('E', "\x00\x00\x00\x00\x00"), msg('S', "")
	tests := []struct {
		name    string
		request string
		want    bool
	}{
		{"bind execute sync", bind + execute + sync, true},
		{"simple query", msg('Q', "SELECT 1\x00"), true},
		{"parse then bind", msg('P', "\x00SELECT $1\x00\x00\x00") + bind, true},
		{"sync only", sync, false},
		{"terminate", msg('X', ""), false},
		{"startup message", "\x00\x00\x00\x08\x04\xd2\x16\x2f", false},
		{"bind cut short", bind[:8], false},
		{"empty", "", false},
	}
	match := MatchPostgresQuery()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, match([]byte(tt.request)))
		})
	}
}

func TestMatchMySQLQuery(t *testing.T) {
	packet := func(seq byte, payload string) string {
		n := len(payload)
		return string([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}) + payload
	}
	tests := []struct {
		name    string
		request string
		want    bool
	}{
		{"query", packet(0, "\x03SELECT 1"), true},
		{"statement execute", packet(0, "\x17\x01\x00\x00\x00"), true},
		{"ping", packet(0, "\x0e"), false},
		{"query byte in a later packet of a command", packet(1, "\x03abc"), false},
		{"after a ping", packet(0, "\x0e") + packet(0, "\x03SELECT 1"), true},
		{"cut short", packet(0, "\x03SELECT 1")[:6], false},
		{"empty", "", false},
	}
	match := MatchMySQLQuery()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, match([]byte(tt.request)))
		})
	}
}
