package testserver

import (
	"bytes"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"strings"
)

// MatchCommand returns a FaultProxy match function that accepts a chunk holding a Redis
// command named name (in any case) whose first arguments are args (byte for byte; none
// given: any arguments). Every complete command in the chunk counts, so a pipeline or a
// MULTI … EXEC block matches when one of its commands does. Commands must be in RESP
// (arrays of bulk strings, as every client library sends them), not inline.
func MatchCommand(name string, args ...string) func(request []byte) bool {
	return func(request []byte) bool {
		for _, cmd := range respCommands(request) {
			if commandIs(cmd, name, args) {
				return true
			}
		}
		return false
	}
}

// MatchEvalSha returns a FaultProxy match function that accepts a chunk holding an
// EVALSHA or EVALSHA_RO of the Lua script whose SHA1 is sha (hex, any case), or an EVAL or
// EVAL_RO of a script with that SHA1 — go-redis's Script.Run sends EVAL after a NOSCRIPT
// reply. As for MatchCommand, every complete RESP command in the chunk counts.
func MatchEvalSha(sha string) func(request []byte) bool {
	sha = strings.ToLower(sha)
	return func(request []byte) bool {
		for _, cmd := range respCommands(request) {
			if len(cmd) < 2 {
				continue
			}
			switch strings.ToUpper(string(cmd[0])) {
			case "EVALSHA", "EVALSHA_RO":
				if strings.ToLower(string(cmd[1])) == sha {
					return true
				}
			case "EVAL", "EVAL_RO":
				sum := sha1.Sum(cmd[1])
				if hex.EncodeToString(sum[:]) == sha {
					return true
				}
			}
		}
		return false
	}
}

func commandIs(cmd [][]byte, name string, args []string) bool {
	if len(cmd) == 0 || !strings.EqualFold(string(cmd[0]), name) || len(cmd)-1 < len(args) {
		return false
	}
	for i, a := range args {
		if string(cmd[1+i]) != a {
			return false
		}
	}
	return true
}

// respCommands parses the RESP commands at the start of b — arrays of bulk strings — and
// returns each one's elements. It stops at the first thing that is not a complete command.
func respCommands(b []byte) [][][]byte {
	var cmds [][][]byte
	for len(b) > 0 {
		cmd, rest, ok := respCommand(b)
		if !ok {
			break
		}
		cmds = append(cmds, cmd)
		b = rest
	}
	return cmds
}

// respCommand parses one array of bulk strings from the start of b.
func respCommand(b []byte) (cmd [][]byte, rest []byte, ok bool) {
	n, b, ok := respLength(b, '*')
	if !ok || n < 1 {
		return nil, nil, false
	}
	cmd = make([][]byte, 0, n)
	for range n {
		var size int
		size, b, ok = respLength(b, '$')
		if !ok || size < 0 || len(b) < size+2 || b[size] != '\r' || b[size+1] != '\n' {
			return nil, nil, false
		}
		cmd = append(cmd, b[:size])
		b = b[size+2:]
	}
	return cmd, b, true
}

// respLength parses "<kind><decimal>\r\n" from the start of b.
func respLength(b []byte, kind byte) (int, []byte, bool) {
	if len(b) == 0 || b[0] != kind {
		return 0, nil, false
	}
	end := bytes.Index(b, []byte("\r\n"))
	if end < 0 {
		return 0, nil, false
	}
	n, err := strconv.Atoi(string(b[1:end]))
	if err != nil {
		return 0, nil, false
	}
	return n, b[end+2:], true
}

// MatchMongoCommand returns a FaultProxy match function that accepts a chunk holding a
// whole MongoDB wire-protocol request (OP_MSG, or OP_QUERY as in a legacy hello) whose
// command — the first key of its body — is name (e.g. "findAndModify", "update"). Every
// whole message in the chunk counts; a message split across chunks is not seen.
func MatchMongoCommand(name string) func(request []byte) bool {
	return func(request []byte) bool {
		for len(request) >= headerLen {
			n := int(int32(binary.LittleEndian.Uint32(request[0:4])))
			if n < headerLen || n > len(request) {
				return false
			}
			if r, err := classify(request[:n]); err == nil && r.command == name {
				return true
			}
			request = request[n:]
		}
		return false
	}
}

// MatchPostgresQuery returns a FaultProxy match function that accepts a chunk holding a
// PostgreSQL frontend message that runs a statement: a Bind (the extended protocol, which pgx
// uses for every query with arguments) or a simple Query. Every whole message in the chunk
// counts; a chunk that starts mid-message, or a startup message, matches nothing.
func MatchPostgresQuery() func(request []byte) bool {
	return func(request []byte) bool {
		for len(request) >= 5 {
			kind := request[0]
			n := int(binary.BigEndian.Uint32(request[1:5])) // counts itself, not the kind byte
			if n < 4 || 1+n > len(request) {
				return false
			}
			if kind == 'B' || kind == 'Q' {
				return true
			}
			request = request[1+n:]
		}
		return false
	}
}

// MatchMySQLQuery returns a FaultProxy match function that accepts a chunk holding a MySQL
// client command that runs a statement: COM_QUERY (text protocol, as go-sql-driver sends a
// query without arguments or with interpolated ones) or COM_STMT_EXECUTE. A command is a
// packet with sequence number 0; a chunk that starts mid-packet matches nothing.
func MatchMySQLQuery() func(request []byte) bool {
	const comQuery, comStmtExecute = 0x03, 0x17
	return func(request []byte) bool {
		for len(request) >= 5 {
			n := int(request[0]) | int(request[1])<<8 | int(request[2])<<16
			if 4+n > len(request) || n == 0 {
				return false
			}
			if seq, cmd := request[3], request[4]; seq == 0 && (cmd == comQuery || cmd == comStmtExecute) {
				return true
			}
			request = request[4+n:]
		}
		return false
	}
}
