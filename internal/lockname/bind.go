package lockname

import (
	"errors"
	"fmt"

	"github.com/guardlock/guard"
)

// Source reads one placeholder's value from what a lock is named after: a decorated call's
// argument, an HTTP request. An error says why there is no value; an empty value is refused
// by Namer.Name.
type Source[T any] func(T) (string, error)

// Namer is a template bound to the sources of its values: what a decorator or a middleware
// turns its input into a lock name with. It is immutable and safe for concurrent use.
type Namer[T any] struct {
	tmpl    *Template
	keys    []string
	sources []Source[T] // one per key
	fixed   string      // the name, when the template has no placeholders
}

// Bind parses template and binds each placeholder key to its source with bind, which returns
// an error for a key it cannot bind. It returns a *guard.NameError whose Name is the template
// and whose Reason is the syntax error with its byte offset, "{key}: " and bind's error, or
// that no name of the template fits in guard.MaxNameLen; for a template without placeholders,
// guard.CheckName's error for its name.
func Bind[T any](template string, bind func(key string) (Source[T], error)) (*Namer[T], error) {
	bad := func(reason string) (*Namer[T], error) {
		return nil, &guard.NameError{Name: template, Reason: reason}
	}
	tmpl, err := Parse(template)
	if err != nil {
		if se, ok := errors.AsType[*SyntaxError](err); ok {
			return bad(fmt.Sprintf("%s (at byte %d)", se.Msg, se.Offset))
		}
		return bad(err.Error())
	}
	n := &Namer[T]{tmpl: tmpl, keys: tmpl.Keys()}
	if len(n.keys) == 0 {
		// A fixed name: check it now rather than on every call.
		n.fixed, _ = tmpl.Render(nil)
		if err := guard.CheckName(n.fixed); err != nil {
			return nil, err
		}
		return n, nil
	}
	if m := tmpl.MinLen(); m > guard.MaxNameLen {
		return bad(fmt.Sprintf("no name fits in %d bytes: the literal text and one byte for each placeholder make %d",
			guard.MaxNameLen, m))
	}
	n.sources = make([]Source[T], len(n.keys))
	for i, key := range n.keys {
		src, err := bind(key)
		if err != nil {
			return bad(fmt.Sprintf("{%s}: %v", key, err))
		}
		n.sources[i] = src
	}
	return n, nil
}

// String returns the template's source text.
func (n *Namer[T]) String() string { return n.tmpl.String() }

// Name renders the lock name of x. It returns a *guard.NameError whose Name is the template
// and whose Reason is "{key}: " and a source's error or "empty value", or that the name would
// be longer than guard.MaxNameLen — which it tells from the values' lengths before rendering
// them when it can, so that a huge value costs its length check, not its escaping. The error
// never carries the values.
func (n *Namer[T]) Name(x T) (string, error) {
	if n.sources == nil {
		return n.fixed, nil
	}
	vals := make([]string, len(n.sources))
	size := n.tmpl.MinLen() - len(vals) // a value renders at least as long as it is
	for i, src := range n.sources {
		v, err := src(x)
		if err != nil {
			return "", n.bad(fmt.Sprintf("{%s}: %v", n.keys[i], err))
		}
		vals[i] = v
		size += len(v)
	}
	if size > guard.MaxNameLen {
		return "", n.tooLong(size)
	}
	name, err := n.tmpl.Render(vals)
	if err != nil {
		reason := err.Error()
		if ve, ok := errors.AsType[*ValueError](err); ok {
			reason = fmt.Sprintf("{%s}: %s", ve.Key, ve.Reason)
		}
		return "", n.bad(reason)
	}
	if len(name) > guard.MaxNameLen {
		return "", n.tooLong(len(name))
	}
	return name, nil
}

// bad returns the *guard.NameError of a name of n's template that cannot be made.
func (n *Namer[T]) bad(reason string) error {
	return &guard.NameError{Name: n.tmpl.String(), Reason: reason}
}

// tooLong returns the error of a name of at least size bytes.
func (n *Namer[T]) tooLong(size int) error {
	return n.bad(fmt.Sprintf("the name would be %d bytes or more, more than %d", size, guard.MaxNameLen))
}

// CallOptions checks opts, the options a decorator or a middleware was built with, and
// returns the options of each of its acquisitions: one attempt, and label as the telemetry
// label, unless opts — which follow them — say otherwise. It returns the first
// *guard.OptionError of opts.
func CallOptions(label string, opts []guard.LockOption) ([]guard.LockOption, error) {
	if err := guard.CheckLockOptions(opts...); err != nil {
		return nil, err
	}
	acq := make([]guard.LockOption, 0, len(opts)+2)
	acq = append(acq, guard.WaitTime(0), guard.Label(label))
	return append(acq, opts...), nil
}
