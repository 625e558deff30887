package testserver

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// procStat returns the parent pid and state of pid from /proc/<pid>/stat; ok is false when
// there is no such process or no /proc to tell.
func procStat(pid int) (ppid int, state byte, ok bool) {
	return statFile("/proc/" + strconv.Itoa(pid) + "/stat")
}

// statFile parses a /proc stat file (a process's or a thread's): "pid (comm) state ppid …".
// comm may hold spaces and parentheses, so the fields are cut at the last ')'.
func statFile(path string) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 2 || len(fields[0]) != 1 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(fields[1])
	return ppid, fields[0][0], err == nil
}

// WaitStopped waits until the kernel reports process pid stopped (after a SIGSTOP), so that
// from then on it runs nothing. It returns nil at once where /proc cannot tell (the signal is
// delivered before the process next runs), and when the process has exited.
func WaitStopped(pid int) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	return poll(ctx, time.Millisecond, func() error {
		if _, state, ok := procStat(pid); ok && state != 'T' && state != 'Z' && state != 'X' {
			return fmt.Errorf("process %d is in state %q", pid, state)
		}
		return nil
	})
}
