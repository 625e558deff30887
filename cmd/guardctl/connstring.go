package main

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// hidden stands in for a secret in what guardctl prints, and in the text of a backend whose
// parse error guardctl prints (see backend.driverParse).
const hidden = "xxxxx"

// secretParam reports whether a URL query or DSN parameter holds a secret: a password
// (password, sentinel_password, sslpassword, tlsCertificateKeyFilePassword, …), a token, a
// key, or MongoDB's authMechanismProperties (which may hold an AWS session token).
func secretParam(name string) bool {
	name = strings.ToLower(name)
	for _, s := range []string{"pass", "pwd", "secret", "token", "key", "authmechanismproperties"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

// syntax is how a -backend string is written.
type syntax int

const (
	urlSyntax      syntax = iota // scheme://[user[:password]@]hosts[/path][?k=v&…]
	keywordSyntax                // libpq: key=value key='quoted value' …
	mysqlDSNSyntax               // go-sql-driver: [user[:password]@][net(addr)]/db[?k=v&…]
)

// param is one parameter of a URL's query or of a DSN.
type param struct {
	key, value string // unescaped (libpq: unquoted)
	raw        string // the value as written
}

// secret reports whether p's value is a secret.
func (p param) secret() bool { return secretParam(p.key) }

// connString is a -backend string taken apart by guardctl's own parser, which reads each
// syntax as its driver does and never quotes what it reads in an error. guardctl prints only
// what it renders of it with the secrets hidden, and gives the drivers what it renders of it
// with them, so that the host a message shows is the host the driver dials.
type connString struct {
	syntax      syntax
	scheme      string // a URL's, as written
	user        string // unescaped for a URL; as written in a MySQL DSN
	password    string
	hasUser     bool
	hasPassword bool
	hosts       string // as written: a URL's host list, a MySQL DSN's net(addr)
	path        string // as written, from its '/'
	params      []param
}

// splitURL takes a URL apart. The user information is everything before the last '@' of the
// authority, which ends at the first '/' or '?', as net/url and the drivers read it; so a
// password may hold '@' and ':' as they are, but '/', '?' and '#' only percent-encoded. A URL
// with a '#' (none of the forms has a fragment) or with an '@' after its host list is
// refused: a password or a parameter holds one of them as it is, and the drivers would take
// part of it for a host, a port or a path — and dial another server than meant.
func splitURL(raw string) (*connString, error) {
	scheme, rest, _ := strings.Cut(raw, "://")
	c := &connString{syntax: urlSyntax, scheme: scheme}
	if strings.Contains(rest, "#") {
		return nil, errors.New("a '#' in the URL, which none of guardctl's forms has: percent-encode it (%23) in a password or a parameter")
	}
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	if strings.Contains(tail, "@") {
		return nil, errors.New("an '@' after the host list: a password that holds '/' or '?' needs them percent-encoded (%2F, %3F), and an '@' in a path or a parameter too (%40)")
	}
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		user, password, hasPassword := strings.Cut(authority[:i], ":")
		var err error
		if c.user, err = unescape(user, "the user name"); err != nil {
			return nil, err
		}
		if c.password, err = unescape(password, "the password"); err != nil {
			return nil, err
		}
		c.hasUser, c.hasPassword = true, hasPassword
		authority = authority[i+1:]
	}
	c.hosts = authority
	var query string
	c.path, query, _ = strings.Cut(tail, "?")
	var err error
	c.params, err = splitQuery(query)
	return c, err
}

// unescape percent-decodes s, a part of a URL's user information, and says in its error
// which part it is, never what it holds.
func unescape(s, part string) (string, error) {
	u, err := url.PathUnescape(s)
	if err != nil {
		return "", fmt.Errorf("%s has a '%%' that is not followed by two hex digits: write '%%' as %%25", part)
	}
	return u, nil
}

// splitQuery takes a URL query (or a DSN's parameters) apart: key=value pairs between '&'s,
// each percent-decoded, '+' for a space. A pair without '=' is refused: it is the tail of a
// value that holds an '&' as it is.
func splitQuery(query string) ([]param, error) {
	var params []param
	for pair := range strings.SplitSeq(query, "&") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, errors.New("a parameter without '=': a value that holds '&' needs it percent-encoded (%26)")
		}
		key, err := url.QueryUnescape(k)
		if err != nil {
			return nil, errors.New("a parameter's name has a '%' that is not followed by two hex digits")
		}
		value, err := url.QueryUnescape(v)
		if err != nil {
			return nil, fmt.Errorf("the value of %s= has a '%%' that is not followed by two hex digits: write '%%' as %%25", key)
		}
		params = append(params, param{key: key, value: value, raw: v})
	}
	return params, nil
}

// splitKeywords takes a libpq keyword/value string apart as pgx does: a keyword is what comes
// before the next '=', trimmed; a value runs to the next space, or is single-quoted, and in
// both a backslash escapes the next byte.
func splitKeywords(raw string) (*connString, error) {
	const space = " \t\n\r\v\f"
	if strings.IndexByte(raw, 0) >= 0 {
		return nil, errors.New("a NUL byte in the connection string")
	}
	c := &connString{syntax: keywordSyntax}
	s := strings.TrimLeft(raw, space)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return nil, errors.New("text without '=' after the last keyword=value: a value that holds spaces goes in single quotes")
		}
		key := strings.Trim(s[:eq], space)
		if key == "" || strings.ContainsAny(key, space) {
			return nil, errors.New("a keyword that is not followed by '=': a value that holds spaces goes in single quotes")
		}
		s = strings.TrimLeft(s[eq+1:], space)
		end := 0
		var value strings.Builder
		if s != "" && s[0] == '\'' {
			for end = 1; end < len(s) && s[end] != '\''; end++ {
				if s[end] == '\\' {
					end++
				}
				if end < len(s) {
					value.WriteByte(s[end])
				}
			}
			if end >= len(s) {
				return nil, fmt.Errorf("the quoted value of %s= has no closing quote", key)
			}
			end++ // the closing quote
		} else {
			for ; end < len(s) && !strings.ContainsRune(space, rune(s[end])); end++ {
				if s[end] == '\\' {
					end++
				}
				if end < len(s) {
					value.WriteByte(s[end])
				}
			}
			end = min(end, len(s))
		}
		c.params = append(c.params, param{key: key, value: value.String(), raw: s[:end]})
		s = strings.TrimLeft(s[end:], space)
	}
	return c, nil
}

// splitMySQLDSN takes a go-sql-driver DSN apart as the driver does: the database follows the
// last '/', the user information ends at the last '@' before it, and the password runs from
// the first ':' of the user information to that '@', as written (the driver unescapes
// nothing there).
func splitMySQLDSN(raw string) (*connString, error) {
	slash := strings.LastIndexByte(raw, '/')
	if slash < 0 {
		return nil, errors.New("a go-sql-driver DSN has a '/' before its database")
	}
	c := &connString{syntax: mysqlDSNSyntax, hosts: raw[:slash]}
	if at := strings.LastIndexByte(raw[:slash], '@'); at >= 0 {
		c.user, c.password, c.hasPassword = strings.Cut(raw[:at], ":")
		c.hasUser = true
		c.hosts = raw[at+1 : slash]
	}
	var query string
	c.path, query, _ = strings.Cut(raw[slash:], "?")
	var err error
	c.params, err = splitQuery(query)
	return c, err
}

// render writes c back in its syntax, with its secrets (the password, and the values of the
// secret parameters) as given, or each replaced by xxxxx with hide.
func (c *connString) render(hide bool) string {
	var b strings.Builder
	var params []string
	for _, p := range c.params {
		if hide && p.secret() {
			params = append(params, p.key+"="+hidden)
		} else {
			params = append(params, p.key+"="+p.raw)
		}
	}
	switch c.syntax {
	case keywordSyntax:
		return strings.Join(params, " ")
	case urlSyntax:
		b.WriteString(c.scheme + "://")
		switch {
		case c.hasPassword && hide:
			b.WriteString(url.User(c.user).String() + ":" + hidden + "@")
		case c.hasPassword:
			b.WriteString(url.UserPassword(c.user, c.password).String() + "@")
		case c.hasUser:
			b.WriteString(url.User(c.user).String() + "@")
		}
	case mysqlDSNSyntax:
		switch {
		case c.hasPassword && hide:
			b.WriteString(c.user + ":" + hidden + "@")
		case c.hasPassword:
			b.WriteString(c.user + ":" + c.password + "@")
		case c.hasUser:
			b.WriteString(c.user + "@")
		}
	}
	b.WriteString(c.hosts + c.path)
	if len(params) > 0 {
		b.WriteString("?" + strings.Join(params, "&"))
	}
	return b.String()
}

// secrets reports whether c holds a secret: a password, or a secret parameter's value.
func (c *connString) secrets() bool {
	if c.hasPassword {
		return true
	}
	for _, p := range c.params {
		if p.secret() && p.value != "" {
			return true
		}
	}
	return false
}

// take removes the parameter key from c, and returns its value and whether it was given. It
// refuses a parameter given more than once.
func (c *connString) take(key string) (string, bool, error) {
	var value string
	found := 0
	kept := c.params[:0]
	for _, p := range c.params {
		if p.key == key {
			value = p.value
			found++
			continue
		}
		kept = append(kept, p)
	}
	c.params = kept
	if found > 1 {
		return "", false, fmt.Errorf("%s= given %d times", key, found)
	}
	return value, found == 1, nil
}
