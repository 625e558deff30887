package testserver

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// wireMessage builds a message: header with opCode, then body.
func wireMessage(opCode int32, body []byte) []byte {
	msg := make([]byte, headerLen, headerLen+len(body))
	msg = append(msg, body...)
	binary.LittleEndian.PutUint32(msg[0:4], uint32(len(msg)))
	binary.LittleEndian.PutUint32(msg[4:8], 7) // requestID
	binary.LittleEndian.PutUint32(msg[12:16], uint32(opCode))
	return msg
}

// buildOpMsg builds an OP_MSG with flags, a kind-1 section first when docs is not empty (drivers
// put it after the body, the protocol allows either order), then the body.
func buildOpMsg(t *testing.T, flags uint32, body bson.D, docs ...bson.D) []byte {
	t.Helper()
	b := binary.LittleEndian.AppendUint32(nil, flags)
	if len(docs) > 0 {
		var seq []byte
		seq = append(seq, "documents\x00"...)
		for _, d := range docs {
			raw, err := bson.Marshal(d)
			require.NoError(t, err)
			seq = append(seq, raw...)
		}
		b = append(b, 1)
		b = binary.LittleEndian.AppendUint32(b, uint32(4+len(seq)))
		b = append(b, seq...)
	}
	raw, err := bson.Marshal(body)
	require.NoError(t, err)
	b = append(b, 0)
	b = append(b, raw...)
	if flags&flagChecksumPresent != 0 {
		b = append(b, 0xde, 0xad, 0xbe, 0xef)
	}
	return wireMessage(opMsg, b)
}

func buildOpQuery(t *testing.T, collection string, query bson.D) []byte {
	t.Helper()
	b := binary.LittleEndian.AppendUint32(nil, 0)
	b = append(b, collection...)
	b = append(b, 0)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint32(b, 0xffffffff)
	raw, err := bson.Marshal(query)
	require.NoError(t, err)
	return wireMessage(opQuery, append(b, raw...))
}

func TestClassify(t *testing.T) {
	cmd := func(name string) bson.D { return bson.D{{Key: name, Value: "c"}, {Key: "$db", Value: "d"}} }
	tests := []struct {
		name    string
		msg     []byte
		want    request
		wantErr bool
	}{
		{"hello", buildOpMsg(t, 0, cmd("hello")), request{command: "hello"}, false},
		{"find", buildOpMsg(t, 0, cmd("find")), request{command: "find"}, false},
		{"findAndModify", buildOpMsg(t, 0, cmd("findAndModify")), request{command: "findAndModify", write: true}, false},
		{"update", buildOpMsg(t, 0, cmd("update")), request{command: "update", write: true}, false},
		{"unknown command is a write", buildOpMsg(t, 0, cmd("frobnicate")), request{command: "frobnicate", write: true}, false},
		{"insert with document sequence first",
			buildOpMsg(t, 0, cmd("insert"), bson.D{{Key: "_id", Value: 1}}),
			request{command: "insert", write: true}, false},
		{"moreToCome", buildOpMsg(t, flagMoreToCome, cmd("delete")),
			request{command: "delete", write: true, moreToCome: true}, false},
		{"checksum", buildOpMsg(t, flagChecksumPresent, cmd("insert")), request{command: "insert", write: true}, false},
		{"legacy hello", buildOpQuery(t, "admin.$cmd", bson.D{{Key: "isMaster", Value: 1}}), request{command: "isMaster"}, false},
		{"OP_QUERY write command", buildOpQuery(t, "d.$cmd", cmd("update")), request{command: "update", write: true}, false},
		{"OP_COMPRESSED", wireMessage(opCompressed, make([]byte, 9)), request{}, true},
		{"OP_INSERT", wireMessage(2002, make([]byte, 9)), request{}, true},
		{"OP_MSG without body", wireMessage(opMsg, make([]byte, 4)), request{}, true},
		{"empty command", buildOpMsg(t, 0, bson.D{}), request{}, true},
		{"bad section size", wireMessage(opMsg, []byte{0, 0, 0, 0, 0, 0xff, 0, 0, 0}), request{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := classify(tt.msg)
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestClearMoreToCome(t *testing.T) {
	body := bson.D{{Key: "insert", Value: "c"}}
	tests := []struct {
		name  string
		flags uint32
	}{
		{"plain", flagMoreToCome},
		{"with checksum", flagMoreToCome | flagChecksumPresent},
		{"exhaustAllowed kept", flagMoreToCome | 1<<16},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := buildOpMsg(t, tt.flags, body)
			out := clearMoreToCome(in)
			want := buildOpMsg(t, tt.flags&^(flagMoreToCome|flagChecksumPresent), body)
			assert.Equal(t, want, out)
			r, err := classify(out)
			require.NoError(t, err)
			assert.False(t, r.moreToCome)
			assert.Equal(t, "insert", r.command)
		})
	}
}

func TestReplyHasMoreToCome(t *testing.T) {
	assert.True(t, replyHasMoreToCome(buildOpMsg(t, flagMoreToCome, bson.D{{Key: "ok", Value: 1}})))
	assert.False(t, replyHasMoreToCome(buildOpMsg(t, 0, bson.D{{Key: "ok", Value: 1}})))
	assert.False(t, replyHasMoreToCome(wireMessage(1, make([]byte, 20))), "OP_REPLY")
}
