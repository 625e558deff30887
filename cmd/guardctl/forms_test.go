package main

import (
	"bytes"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/guardlock/guard/internal/testserver"
)

// awkward are passwords that trip a parser that does not read a form as its driver does:
// digits (a port), the delimiters of a URL, '%' (an escape), a space, a libpq escape and quote,
// and one character (which a redaction by substring hides everywhere, or nowhere).
var awkward = []string{"123456", "12#34", "12/34", "12?34", "Zq@ss", "Zq:b:c", "Zq50%", "Zq%41", "Zq 5", "Zq&5", `Zq\'s`, "Z"}

// formCase is one way to write a -backend string with a password in it.
type formCase struct {
	name string
	// build writes the string with password pw, escaped as the syntax wants it (escaped) or
	// as it is.
	build func(pw, addr string, escaped bool) string
	// raw says whether pw written as it is must be taken as it is (true) or refused (false);
	// written escaped it is always taken.
	raw      func(pw string) bool
	host     func(b *backend) string // the host:port guardctl would dial
	password func(b *backend) string // the password it would send; nil: not known before open
}

// userinfo escapes pw for a URL's user information, or not.
func userinfo(pw string, escaped bool) string {
	if !escaped {
		return pw
	}
	return strings.TrimPrefix(url.UserPassword("", pw).String(), ":")
}

// query escapes pw for a URL's query, or not.
func query(pw string, escaped bool) string {
	if !escaped {
		return pw
	}
	return strings.ReplaceAll(url.QueryEscape(pw), "+", "%20") // pgx reads '+' as itself
}

// inURL: a password written as it is in a URL's user information is taken when it holds
// none of '/', '?', '#', and no '%' that is not an escape; in a query, none of '#', '&', '@',
// '%' (pgx's query takes no space either). A '%' that is an escape is one: "%41" is "A".
func inURL(pw string) bool   { return !strings.ContainsAny(pw, "/?#%") }
func inQuery(pw string) bool { return !strings.ContainsAny(pw, "#%&@") }
func inPgQuery(pw string) bool {
	return !strings.ContainsAny(pw, "#%&@ ")
}

var formCases = []formCase{
	{"redis userinfo", func(pw, addr string, e bool) string { return "redis://ops:" + userinfo(pw, e) + "@" + addr + "/0" }, inURL,
		func(b *backend) string { return b.redis.Addr }, func(b *backend) string { return b.redis.Password }},
	{"rediss userinfo", func(pw, addr string, e bool) string { return "rediss://:" + userinfo(pw, e) + "@" + addr }, inURL,
		func(b *backend) string { return b.redis.Addr }, func(b *backend) string { return b.redis.Password }},
	{"cluster userinfo", func(pw, addr string, e bool) string {
		return "redis+cluster://ops:" + userinfo(pw, e) + "@" + addr + ",127.0.0.2:7001"
	}, inURL, func(b *backend) string { return b.cluster.Addrs[0] }, func(b *backend) string { return b.cluster.Password }},
	{"sentinel userinfo", func(pw, addr string, e bool) string {
		return "redis+sentinel://sen:" + userinfo(pw, e) + "@" + addr + "?master_name=m"
	}, inURL, func(b *backend) string { return b.failover.SentinelAddrs[0] }, func(b *backend) string { return b.failover.SentinelPassword }},
	{"sentinel ?password=", func(pw, addr string, e bool) string {
		return "redis+sentinel://" + addr + "/1?master_name=m&password=" + query(pw, e)
	}, inQuery, func(b *backend) string { return b.failover.SentinelAddrs[0] }, func(b *backend) string { return b.failover.Password }},
	{"sentinel ?sentinel_password=", func(pw, addr string, e bool) string {
		return "rediss+sentinel://sen@" + addr + "?sentinel_password=" + query(pw, e) + "&master_name=m"
	}, inQuery, func(b *backend) string { return b.failover.SentinelAddrs[0] }, func(b *backend) string { return b.failover.SentinelPassword }},
	{"mongodb userinfo", func(pw, addr string, e bool) string {
		return "mongodb://app:" + userinfo(pw, e) + "@" + addr + "/db?collection=locks"
	}, inURL, func(b *backend) string { return b.mongo.Hosts[0] }, func(b *backend) string { return b.mongo.Auth.Password }},
	{"mongodb+srv userinfo", func(pw, _ string, e bool) string {
		return "mongodb+srv://app:" + userinfo(pw, e) + "@cluster0.guardctl.invalid/db?collection=locks"
	}, inURL, nil, nil},
	{"mongodb ?tlsCertificateKeyFilePassword=", func(pw, addr string, e bool) string {
		return "mongodb://" + addr + "/db?collection=locks&tlsCertificateKeyFilePassword=" + query(pw, e)
	}, inQuery, func(b *backend) string { return b.mongo.Hosts[0] }, nil},
	{"postgres userinfo", func(pw, addr string, e bool) string {
		return "postgres://app:" + userinfo(pw, e) + "@" + addr + "/app?sslmode=disable"
	}, inURL, pgHost, func(b *backend) string { return b.pg.ConnConfig.Password }},
	{"postgresql ?password=", func(pw, addr string, e bool) string {
		return "postgresql://app@" + addr + "/app?password=" + query(pw, e) + "&sslmode=disable"
	}, inPgQuery, pgHost, func(b *backend) string { return b.pg.ConnConfig.Password }},
	{"postgres ?sslpassword=", func(pw, addr string, e bool) string {
		return "postgres://app@" + addr + "/app?sslmode=disable&sslpassword=" + query(pw, e)
	}, inPgQuery, pgHost, nil},
	{"libpq keyword=value", func(pw, addr string, e bool) string {
		host, port, _ := net.SplitHostPort(addr)
		if e {
			pw = "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw) + "'"
		}
		return "host=" + host + " port=" + port + " user=app password=" + pw + " dbname=app sslmode=disable"
	}, func(pw string) bool { return !strings.Contains(pw, " ") }, pgHost, func(b *backend) string { return b.pg.ConnConfig.Password }},
	{"mysql userinfo", func(pw, addr string, e bool) string { return "mysql://app:" + userinfo(pw, e) + "@" + addr + "/app" }, inURL,
		func(b *backend) string { return b.mysql.Addr }, func(b *backend) string { return b.mysql.Passwd }},
	{"mariadb userinfo", func(pw, addr string, e bool) string {
		return "mariadb://app:" + userinfo(pw, e) + "@" + addr + "/app?table=locks"
	}, inURL, func(b *backend) string { return b.mysql.Addr }, func(b *backend) string { return b.mysql.Passwd }},
	{"mysql DSN", func(pw, addr string, _ bool) string { return "app:" + pw + "@tcp(" + addr + ")/app?parseTime=true" },
		func(string) bool { return true }, func(b *backend) string { return b.mysql.Addr }, func(b *backend) string { return b.mysql.Passwd }},
	{"etcd userinfo", func(pw, addr string, e bool) string {
		return "etcd://ops:" + userinfo(pw, e) + "@" + addr + ",127.0.0.2:2379/app/"
	}, inURL, func(b *backend) string { return b.etcd.Endpoints[0] }, func(b *backend) string { return b.etcd.Password }},
	{"etcds userinfo", func(pw, addr string, e bool) string { return "etcds://root:" + userinfo(pw, e) + "@" + addr }, inURL,
		func(b *backend) string { return b.etcd.Endpoints[0] }, func(b *backend) string { return b.etcd.Password }},
}

func pgHost(b *backend) string {
	return net.JoinHostPort(b.pg.ConnConfig.Host, strconv.Itoa(int(b.pg.ConnConfig.Port)))
}

// TestForms: every form of -backend, with each awkward password written escaped and as it
// is. guardctl must take it with the host and the password meant, or refuse it (status 2) —
// never dial another host — and show it as the same string with the password xxxxx. Then the
// command runs on it against a port that refuses connections: nothing it prints may hold the
// password, in any spelling.
func TestForms(t *testing.T) {
	t.Setenv(backendEnv, "")
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(testserver.FreePort(t)))
	for _, fc := range formCases {
		for _, pw := range awkward {
			for _, escaped := range []bool{true, false} {
				libpq := strings.HasPrefix(fc.name, "libpq")
				switch {
				case !escaped && strings.Contains(pw, "%41") && fc.name != "mysql DSN" && !libpq,
					!escaped && strings.Contains(pw, `\`) && libpq:
					// Not this password written as it is: in a URL %41 is an escape, and in a
					// libpq string a backslash is.
					continue
				}
				raw := fc.build(pw, addr, escaped)
				t.Run(fc.name+"/"+strconv.Quote(pw)+"/"+map[bool]string{true: "escaped", false: "as is"}[escaped], func(t *testing.T) {
					b, err := parseBackend(raw, nil, defaultTimeout)
					if !escaped && !fc.raw(pw) {
						require.Error(t, err, "taken: %q", raw)
						assert.ErrorAs(t, err, new(usageError))
					} else {
						require.NoError(t, err, "refused: %q", raw)
						assert.Equal(t, fc.build(hidden, addr, false), b.url, "what guardctl shows")
						if fc.host != nil {
							assert.Equal(t, addr, fc.host(b), "the host")
						}
						if fc.password != nil {
							assert.Equal(t, pw, fc.password(b), "the password")
						}
					}
					if len(pw) < 3 { // printed, one character would be in any text; b.url is checked
						return
					}
					var stdout, stderr bytes.Buffer
					code := run(t.Context(), []string{"-timeout", "200ms", "-backend", raw, "list"}, strings.NewReader(""), &stdout, &stderr)
					assert.NotZero(t, code)
					assertNoSecret(t, stdout.String()+stderr.String(), pw)
				})
			}
		}
	}
}

// assertNoSecret checks that out holds pw in none of its spellings.
func assertNoSecret(t *testing.T, out, pw string) {
	t.Helper()
	for _, s := range []string{pw, url.QueryEscape(pw), url.PathEscape(pw), userinfo(pw, true)} {
		assert.NotContains(t, out, s, "a secret was printed")
	}
	if strings.HasPrefix(pw, "Zq") {
		assert.NotContains(t, out, "Zq", "a part of a secret was printed")
	}
}

// TestSlips: a backend string in the wrong place on the command line — after a mistyped flag,
// as another flag's value, as the command or a lock name — is refused, and shown without its
// secrets.
func TestSlips(t *testing.T) {
	t.Setenv(backendEnv, "redis://127.0.0.1:1")
	const pw = "Zq12#34"
	for _, fc := range formCases {
		// Nothing listens there: a slip that were taken must not reach a server of the machine.
		raw := fc.build(pw, net.JoinHostPort("127.0.0.1", strconv.Itoa(testserver.FreePort(t))), true)
		for _, args := range [][]string{
			{"-backed", raw, "list"},
			{"-timeout", raw, "list"},
			{"-interval=" + raw, "list"},
			{"-json=" + raw, "list"},
			{raw, "list"},
			{"list", raw},
			{"show", raw},
			{"release", "-backend", raw, "x"},
			{"-" + raw, "list"},
			{"--", raw, "list"},
		} {
			t.Run(fc.name+"/"+args[0], func(t *testing.T) {
				var stdout, stderr bytes.Buffer
				code := run(t.Context(), args, strings.NewReader(""), &stdout, &stderr)
				assert.Equal(t, 2, code, "%s", &stderr)
				assertNoSecret(t, stdout.String()+stderr.String(), pw)
				assertOneLine(t, stderr.String(), "")
			})
		}
	}
}
