package etcdstore

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRecordValue: a record keeps the value its holder publishes (an election's leader), and a
// record written before records had one reads as one without.
func TestRecordValue(t *testing.T) {
	r := record{kind: kindCaller, at: time.UnixMilli(1000), expires: time.UnixMilli(2000), ttl: time.Second,
		instance: "host/1", label: "job", value: "leader\x00\xff"}
	got, err := decodeRecord([]byte(r.encode()))
	require.NoError(t, err)
	assert.Equal(t, r, got)

	// The format before the value: the same fields, up to the label.
	old := []byte{kindCaller, recordV1}
	old = binary.AppendVarint(old, 1000)
	old = binary.AppendVarint(old, 2000)
	old = binary.AppendUvarint(old, 1000)
	old = binary.AppendUvarint(old, 0)
	old = binary.AppendUvarint(old, 0)
	old = binary.AppendUvarint(old, 6)
	old = append(old, "host/1"...)
	old = binary.AppendUvarint(old, 3)
	old = append(old, "job"...)
	got, err = decodeRecord(old)
	require.NoError(t, err)
	r.value = ""
	assert.Equal(t, r, got)

	r.shared, r.limit, r.value = true, 3, "v"
	got, err = decodeRecord([]byte(r.encode()))
	require.NoError(t, err)
	assert.Equal(t, r, got, "a shared record")

	_, err = decodeRecord(append(old, 9, 'x'))
	require.ErrorIs(t, err, errBadRecord, "a value cut short")
}
