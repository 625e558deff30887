package main

import (
	"bytes"
	"context"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/testserver"
	"github.com/guardlock/guard/memstore"
)

// secret matches the secrets of the redaction tests: every one starts with "s3c".
var secret = regexp.MustCompile(`s3c\S*`)

// TestSecretsNeverPrinted runs the command on every URL and DSN form guardctl takes, with a
// password in each place the form allows one, against servers that refuse the connection or
// URLs that the drivers cannot parse: no message may show a secret, whole or in part.
func TestSecretsNeverPrinted(t *testing.T) {
	t.Setenv(backendEnv, "")
	refused := net.JoinHostPort("127.0.0.1", strconv.Itoa(testserver.FreePort(t)))
	tests := []struct {
		form, url string
		code      int
	}{
		{"userinfo", "redis://ops:s3cA@" + refused + "/0", 1},
		{"?password=, which go-redis does not take", "redis://" + refused + "/0?password=s3cB", 2},
		{"Sentinel userinfo, ?password= and ?sentinel_password=",
			"redis+sentinel://sen:s3cC@" + refused + "?master_name=m&password=s3cD", 1},
		{"?sentinel_password=", "redis+sentinel://sen@" + refused + "?master_name=m&sentinel_password=s3cE", 1},
		{"a password with / ? #", "redis://ops:s3c/F?x#y@" + refused, 2},
		{"cluster, escaped", "redis+cluster://ops:s3c%2FG@" + refused, 1},
		{"libpq key=value", "host=127.0.0.1 port=" + portOf(refused) + " user=app password=s3cH dbname=app sslmode=disable", 1},
		{"libpq key=value, quoted", "host=127.0.0.1 port=" + portOf(refused) + " user=app password='s3c I\\'' dbname=app", 1},
		{"postgres URL", "postgres://app:s3cJ@" + refused + "/app?sslmode=disable", 1},
		{"postgres ?password= and ?sslpassword=", "postgres://app@" + refused + "/app?password=s3cK&sslpassword=s3cK2&sslmode=disable", 1},
		{"mysql URL", "mysql://app:s3cL@" + refused + "/app", 1},
		{"mysql DSN", "app:s3cM@tcp(" + refused + ")/app?parseTime=true", 1},
		{"mongodb", "mongodb://app:s3cN@" + refused + "/db?collection=locks", 1},
		{"mongodb+srv", "mongodb+srv://app:s3cO@cluster0.guardctl.invalid/db?collection=locks", 1},
		{"mongodb ?tlsCertificateKeyFilePassword=",
			"mongodb://" + refused + "/db?collection=locks&tlsCertificateKeyFilePassword=s3cP", 1},
		{"etcd", "etcd://ops:s3cN2@" + refused + "/app/", 1},
		{"etcds, two endpoints", "etcds://ops:s3cN3@" + refused + ",127.0.0.1:1", 1},
		// Parse errors: the drivers' messages may quote what they could not parse.
		{"redis, an unknown option", "redis://ops:s3cQ@cache:6379?bogus=1", 2},
		{"redis, a bad port", "redis://ops:s3cR@cache:port", 2},
		{"postgres, a bad port", "postgres://app:s3cS@db:port/app", 2},
		{"postgres, a bad escape", "postgres://app:s3c%zzT@db/app", 2},
		{"libpq, a bad port", "host=db port=x user=app password=s3cU", 2},
		{"mysql, a bad parameter", "mysql://app:s3cV@db/app?timeout=soon", 2},
		{"mysql DSN, a bad parameter", "app:s3cW@tcp(db)/app?timeout=soon", 2},
		{"mongodb, a bad option", "mongodb://app:s3cX@h/db?collection=l&connectTimeoutMS=soon", 2},
		{"mongodb+srv, a port", "mongodb+srv://app:s3cY@h1:27017/db?collection=l", 2},
		{"etcd, a bad port", "etcd://ops:s3cZ1@h:port/app/", 2},
		{"etcd, a password without a user", "etcd://:s3cZ2@h:2379", 2},
		{"etcd, a parameter", "etcd://ops:s3cZ3@h:2379?password=s3cZ4", 2},
		{"unknown scheme", "memcached://app:s3cZ@h:11211", 2},
		{"neither URL nor DSN", "app s3c0 nonsense", 2},
	}
	var table strings.Builder
	for _, tt := range tests {
		t.Run(tt.form, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), []string{"-timeout", "1s", "-backend", tt.url, "list"}, strings.NewReader(""), &stdout, &stderr)
			assert.Equal(t, tt.code, code, "%s", &stderr)
			out := stdout.String() + stderr.String()
			assert.Empty(t, secret.FindAllString(out, -1), "a secret was printed: %s", out)
			assert.NotContains(t, out, "3c", "a part of a secret was printed: %s", out)
			assertOneLine(t, stderr.String(), "")
			table.WriteString("| " + tt.form + " | `" + tt.url + "` | `" + strings.TrimSpace(stderr.String()) + "` |\n")
		})
	}
	t.Logf("form | -backend | guardctl's message\n%s", table.String())
}

// portOf returns the port of host:port.
func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}

// TestWatchHeaderHidesSecrets: the header watch prints above every refresh names the backend
// without its secrets.
func TestWatchHeaderHidesSecrets(t *testing.T) {
	store := memstore.New()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := &firstWrite{done: cancel}
	open := func(context.Context, *backend) (guard.Inspector, func(), error) { return store, func() {}, nil }
	url := "redis+sentinel://sen@127.0.0.1:1/2?master_name=m&password=s3cB&sentinel_password=s3cC"
	code := runWith(ctx, open, []string{"-backend", url, "-interval", "1h", "watch"}, strings.NewReader(""), out, &bytes.Buffer{})
	require.Equal(t, 0, code)
	header, _, _ := strings.Cut(out.String(), "\n")
	assert.Regexp(t, `^Every 1h0m0s: guardctl list "" on redis\+sentinel://sen@127\.0\.0\.1:1/2\?master_name=m&password=xxxxx&sentinel_password=xxxxx  \S+$`, header)
}

// firstWrite is a writer that calls done after its first write.
type firstWrite struct {
	done func()
	mu   sync.Mutex // protects buf
	buf  bytes.Buffer
}

func (w *firstWrite) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done()
	return w.buf.Write(p)
}

func (w *firstWrite) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestHelpHidesEnvironment: -h must not show GUARDCTL_BACKEND's value as -backend's default:
// the variable is where the docs tell operators to keep the password.
func TestHelpHidesEnvironment(t *testing.T) {
	t.Setenv(backendEnv, "redis://ops:s3cA@cache:6379?password=s3cB")
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, run(t.Context(), []string{"-h"}, nil, &stdout, &stderr))
	assert.Empty(t, secret.FindAllString(stdout.String()+stderr.String(), -1), "%s", &stdout)
	assert.Contains(t, stdout.String(), "$GUARDCTL_BACKEND")

}
