package testserver

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStatFile(t *testing.T) {
	tests := []struct {
		name, content string
		ppid          int
		state         byte
		ok            bool
	}{
		{"plain", "42 (redis-server) S 7 42 42 0 -1", 7, 'S', true},
		{"comm with spaces and parentheses", "42 (a) T (b c)) T 9 42 42", 9, 'T', true},
		{"no closing parenthesis", "42 (redis-server S 7", 0, 0, false},
		{"cut short", "42 (x) R", 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "stat")
			require.NoError(t, os.WriteFile(path, []byte(tt.content), 0o600))
			ppid, state, ok := statFile(path)
			assert.Equal(t, tt.ok, ok)
			assert.Equal(t, tt.ppid, ppid)
			assert.Equal(t, tt.state, state)
		})
	}
	_, _, ok := statFile(filepath.Join(t.TempDir(), "missing"))
	assert.False(t, ok)
}

func TestWaitStopped(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	require.NoError(t, WaitStopped(cmd.Process.Pid))
	if _, state, ok := procStat(cmd.Process.Pid); ok {
		assert.Equal(t, byte('T'), state)
	}
	require.NoError(t, cmd.Process.Kill())
	_, _ = cmd.Process.Wait()
	assert.NoError(t, WaitStopped(cmd.Process.Pid), "a process that exited is not waited for")
}
