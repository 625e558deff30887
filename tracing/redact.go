package tracing

import (
	"reflect"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Errors carry the lock name in their text: guard's own (*guard.OpError, *guard.BusyError,
// *guard.NameError quote it) and, now and then, a driver's (a duplicate key). Under NameHashed
// and NameDropped the observer records an error's text with the name taken out, so that a
// span's status, its events and its exception messages never carry what the policy hides.

// message returns the text of err, an error about the lock called name, as the spans record
// it: as it is under NameRaw; otherwise with the name replaced by what the policy records of
// it ("#" and its hash, or "#redacted"), wherever it stands in Go's quotes — whole, or cut to
// the 64 characters a *guard.NameError quotes — or bare between characters that are not
// letters or digits.
func (o *Observer) message(name string, err error) string {
	text := err.Error()
	if o.names == NameRaw || name == "" {
		return text
	}
	ref := "#redacted"
	if o.names == NameHashed {
		ref = "#" + HashName(name)
	}
	quoted := strconv.Quote(name)
	text = strings.ReplaceAll(text, quoted, ref)
	if cut := firstRunes(name, 64); cut != name {
		text = strings.ReplaceAll(text, strconv.Quote(cut), ref)
	}
	text = replaceWord(text, name, ref)
	if inner := quoted[1 : len(quoted)-1]; inner != name {
		text = replaceWord(text, inner, ref) // quoted inside another quoted string
	}
	return text
}

// firstRunes returns the first n runes of s.
func firstRunes(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

// replaceWord replaces each occurrence of word in text that is not part of a longer run of
// letters and digits: "account:7" in "key account:7 gone", not "n" in "not".
func replaceWord(text, word, ref string) string {
	var b strings.Builder
	for {
		i := strings.Index(text, word)
		if i < 0 {
			break
		}
		end := i + len(word)
		before, _ := utf8.DecodeLastRuneInString(text[:i])
		after, _ := utf8.DecodeRuneInString(text[end:])
		b.WriteString(text[:i])
		if i > 0 && isAlnum(before) || end < len(text) && isAlnum(after) {
			b.WriteString(word)
		} else {
			b.WriteString(ref)
		}
		text = text[end:]
	}
	if b.Len() == 0 {
		return text
	}
	b.WriteString(text)
	return b.String()
}

func isAlnum(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }

// The exception event, as OpenTelemetry's semantic conventions name it.
const (
	exceptionEvent   = "exception"
	exceptionType    = attribute.Key("exception.type")
	exceptionMessage = attribute.Key("exception.message")
)

// recordError adds err's exception event to span with msg as its message: what
// span.RecordError does, with the text of the name policy.
func recordError(span trace.Span, err error, msg string) {
	span.AddEvent(exceptionEvent, trace.WithAttributes(exceptionType.String(errorType(err)), exceptionMessage.String(msg)))
}

// errorType names err's type as span.RecordError does.
func errorType(err error) string {
	t := reflect.TypeOf(err)
	if t.PkgPath() == "" && t.Name() == "" {
		return t.String()
	}
	return t.PkgPath() + "." + t.Name()
}
