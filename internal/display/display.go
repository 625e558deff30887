// Package display holds the rule by which the stores whose servers keep text — MongoDB,
// PostgreSQL, MySQL — store what guard.Request carries for operators: Instance and Label. A
// Guard passes those as its caller gave them, and a server that refuses a NUL byte or
// invalid UTF-8 in a text column would otherwise fail every acquisition that carries one.
package display

import "strings"

// Text returns s as text any server keeps: each run of bytes that is not valid UTF-8, and
// each NUL byte, replaced by U+FFFD. Text of valid UTF-8 without NUL is s itself.
func Text(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// Cut returns s cut to its first n characters, at a character boundary; s itself when it is
// no longer.
func Cut(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}
