package display

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestText(t *testing.T) {
	tests := map[string]string{
		"":                "",
		"worker-1":        "worker-1",
		"report:{day}":    "report:{day}",
		"a\x00b":          "a\uFFFDb",
		"a\xffb":          "a\uFFFDb",
		"a\xff\xfeb":      "a\uFFFDb",
		"é\xc3":           "é\uFFFD",
		"\x00\x00":        "\uFFFD\uFFFD",
		"naïve \u2603":    "naïve \u2603",
		"tab\tand\nlines": "tab\tand\nlines",
	}
	for in, want := range tests {
		assert.Equal(t, want, Text(in), "%q", in)
	}
}

func TestCut(t *testing.T) {
	assert.Equal(t, "abc", Cut("abc", 3))
	assert.Equal(t, "ab", Cut("abc", 2))
	assert.Equal(t, "", Cut("abc", 0))
	assert.Equal(t, "éé", Cut("ééé", 2))
	assert.Equal(t, strings.Repeat("x", 255), Cut(strings.Repeat("x", 1024), 255))
}
