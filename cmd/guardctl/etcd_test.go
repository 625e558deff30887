package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/etcdstore"
	"github.com/guardlock/guard/internal/testserver"
)

// TestBinaryEtcdAuth runs the binary on an etcd member with authentication on: guardctl logs
// in with the URL's user and an awkward password, percent-encoded, and sees the locks a
// Guard with the same credentials holds; a wrong password, or none, fails with exit status 1
// and etcd's reason, and no spelling of the password is printed; release -force breaks the
// lock.
func TestBinaryEtcdAuth(t *testing.T) {
	t.Parallel()
	const pw = "Zq@:/?#%& 5"
	member := testserver.StartEtcd(t)
	endpoint := member.Endpoints()[0]
	newClient := func(user, password string) *clientv3.Client {
		c, err := clientv3.New(clientv3.Config{
			Endpoints: []string{endpoint}, Username: user, Password: password,
			DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	admin := newClient("", "")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := admin.UserAdd(ctx, "root", pw)
	require.NoError(t, err)
	_, err = admin.UserGrantRole(ctx, "root", "root")
	require.NoError(t, err)
	_, err = admin.AuthEnable(ctx)
	require.NoError(t, err)

	store := etcdstore.New(newClient("root", pw), etcdstore.WithPrefix("app/"))
	t.Cleanup(func() { _ = store.Close() })
	g := guard.New(store, guard.WithInstance("test-instance"), guard.WithWatchdogTimeout(watchdogTimeout))
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	l := acquire(t, g, "auth:a")

	backend := func(password string) string {
		return "etcd://root:" + userinfo(password, true) + "@" + endpoint + "/app/"
	}
	rows := parseTable(t, ok(t, "-backend", backend(pw), "list"))
	require.Len(t, rows, 1)
	assert.Equal(t, "auth:a", rows[0]["NAME"])
	assert.Equal(t, strconv.FormatUint(l.Fence(), 10), rows[0]["FENCE"])

	for _, tt := range []struct{ name, url, want string }{
		{"a wrong password", backend(pw + "x"), "authentication failed"},
		{"no credentials", "etcd://" + endpoint + "/app/", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := ctl(t, nil, "-timeout", "2s", "-backend", tt.url, "list")
			t.Logf("exit %d: %s", r.code, r.stderr)
			assert.Equal(t, 1, r.code)
			assert.Empty(t, r.stdout)
			assertOneLine(t, r.stderr, tt.want)
			assertNoSecret(t, r.stderr, pw)
		})
	}
	require.NoError(t, l.Err(), "the lock is still held")

	// release -force, logged in: the holder's context ends, and the next holder's fence is
	// higher.
	out := ok(t, "-backend", backend(pw), "-yes", "-force", "release", "auth:a")
	assert.Contains(t, out, "released auth:a, held by test-instance")
	require.ErrorIs(t, ended(t, l), guard.ErrLockLost)
	assert.Equal(t, "free", parseFields(t, ok(t, "-backend", backend(pw), "show", "auth:a"))["STATE"])
	assert.Greater(t, acquire(t, g, "auth:a").Fence(), l.Fence())
}
