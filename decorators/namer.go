package decorators

import (
	"encoding"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/guardlock/guard/internal/lockname"
)

// newNamer compiles template against A: each placeholder is a field path, resolved once here;
// a call only walks it. It returns a *guard.NameError naming the template.
func newNamer[A any](template string) (*lockname.Namer[reflect.Value], error) {
	typ := reflect.TypeFor[A]()
	return lockname.Bind(template, func(key string) (lockname.Source[reflect.Value], error) {
		p, err := compilePath(typ, key)
		if err != nil {
			return nil, err
		}
		return p.value, nil
	})
}

// fieldPath reaches one placeholder's value from the argument.
type fieldPath struct {
	steps  []step
	format formatter
}

// step is one move along a field path.
type step struct {
	where string        // the path so far, for errors ("the argument", "Tenant")
	deref bool          // follow a pointer
	index []int         // else, when set: a struct field (reflect.Value.FieldByIndexErr)
	key   reflect.Value // else: a map key
}

// formatter turns a value reached by a field path into its text.
type formatter func(reflect.Value) (string, error)

var (
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
	stringerType      = reflect.TypeFor[fmt.Stringer]()
)

// compilePath resolves a placeholder key — "." or a dotted path of field names and map keys —
// against typ.
func compilePath(typ reflect.Type, key string) (fieldPath, error) {
	var p fieldPath
	where := "the argument"
	if key != "." {
		for elem := range strings.SplitSeq(key, ".") {
			if elem == "" {
				return p, errors.New("empty element in field path")
			}
			for typ.Kind() == reflect.Pointer {
				p.steps = append(p.steps, step{where: where, deref: true})
				typ = typ.Elem()
			}
			switch typ.Kind() {
			case reflect.Struct:
				sf, ok := typ.FieldByName(elem)
				if !ok || !sf.IsExported() {
					return p, fmt.Errorf("%s (%s) has no exported field %s", where, typ, elem)
				}
				p.steps = append(p.steps, step{where: where, index: sf.Index})
				typ = sf.Type
			case reflect.Map:
				if typ.Key().Kind() != reflect.String {
					return p, fmt.Errorf("%s (%s) is a map without string keys", where, typ)
				}
				p.steps = append(p.steps, step{where: where, key: reflect.ValueOf(elem).Convert(typ.Key())})
				typ = typ.Elem()
			default:
				return p, fmt.Errorf("%s (%s) is not a struct or map, so has no %s", where, typ, elem)
			}
			if where == "the argument" {
				where = elem
			} else {
				where += "." + elem
			}
		}
	}
	f, err := formatterFor(typ)
	if err != nil {
		return p, fmt.Errorf("%s: %w", where, err)
	}
	p.format = f
	return p, nil
}

// value walks the path from the argument and formats what it reaches.
func (p *fieldPath) value(v reflect.Value) (string, error) {
	for _, s := range p.steps {
		switch {
		case s.deref:
			if v.IsNil() {
				return "", fmt.Errorf("%s is a nil pointer", s.where)
			}
			v = v.Elem()
		case s.index != nil:
			f, err := v.FieldByIndexErr(s.index)
			if err != nil {
				return "", fmt.Errorf("%s: nil embedded pointer", s.where)
			}
			v = f
		default:
			e := v.MapIndex(s.key)
			if !e.IsValid() {
				return "", fmt.Errorf("%s has no key %q", s.where, s.key.String())
			}
			v = e
		}
	}
	return p.format(v)
}

// formatterFor returns how to format values of typ (see the package doc), or an error when
// they cannot be formatted. A value whose IsZero method reports true is refused, as an empty
// one is.
func formatterFor(typ reflect.Type) (formatter, error) {
	f, err := formatByType(typ)
	if err != nil {
		return nil, err
	}
	if typ.Kind() == reflect.Interface {
		// The dynamic value is known only at the call: ask it then.
		return func(v reflect.Value) (string, error) {
			if err := dynamicZero(v); err != nil {
				return "", err
			}
			return f(v)
		}, nil
	}
	if typ.Kind() == reflect.Pointer || !implements(typ, isZeroerType) {
		// A pointer's element is checked once the pointer is followed.
		return f, nil
	}
	zero := call(typ, isZeroerType, func(x any) (string, error) {
		if x.(isZeroer).IsZero() {
			return "", errZeroValue
		}
		return "", nil
	})
	return func(v reflect.Value) (string, error) {
		if _, err := zero(v); err != nil {
			return "", err
		}
		return f(v)
	}, nil
}

// dynamicZero returns errZeroValue when the value held by the interface v says by its IsZero
// method that it is unset, and an error when that method panics. A nil, or a typed nil, is left
// to the formatter, which says so.
func dynamicZero(v reflect.Value) (err error) {
	if v.IsNil() || !v.CanInterface() {
		return nil
	}
	e := v.Elem()
	if e.Kind() == reflect.Pointer && e.IsNil() {
		return nil
	}
	z, ok := v.Interface().(isZeroer)
	if !ok {
		return nil
	}
	defer func() {
		if recover() != nil {
			err = fmt.Errorf("the IsZero method of %T panicked", z)
		}
	}()
	if z.IsZero() {
		return errZeroValue
	}
	return nil
}

// isZeroer is the method that says a value is unset: time.Time has it.
type isZeroer interface{ IsZero() bool }

var (
	isZeroerType = reflect.TypeFor[isZeroer]()
	errZeroValue = errors.New("zero value")
	errNil       = errors.New("nil")
)

// formatByType returns how to format values of typ, whatever their value.
func formatByType(typ reflect.Type) (formatter, error) {
	marshal := func(x any) (string, error) {
		b, err := x.(encoding.TextMarshaler).MarshalText()
		return string(b), err
	}
	str := func(x any) (string, error) { return x.(fmt.Stringer).String(), nil }
	switch {
	case typ.Kind() == reflect.Pointer:
		// Followed first, even when the pointer has the element's MarshalText: the element's
		// formatter asks its IsZero, so a pointer to a zero time is refused as the time is.
		elem, err := formatterFor(typ.Elem())
		if err != nil {
			return nil, err
		}
		return func(v reflect.Value) (string, error) {
			if v.IsNil() {
				return "", errors.New("nil pointer")
			}
			return elem(v.Elem())
		}, nil
	case implements(typ, textMarshalerType):
		return call(typ, textMarshalerType, marshal), nil
	}
	switch typ.Kind() {
	case reflect.String:
		return func(v reflect.Value) (string, error) { return v.String(), nil }, nil
	case reflect.Bool:
		return func(v reflect.Value) (string, error) { return strconv.FormatBool(v.Bool()), nil }, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return func(v reflect.Value) (string, error) { return strconv.FormatInt(v.Int(), 10), nil }, nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return func(v reflect.Value) (string, error) { return strconv.FormatUint(v.Uint(), 10), nil }, nil
	case reflect.Float32, reflect.Float64:
		bits := typ.Bits()
		return func(v reflect.Value) (string, error) { return strconv.FormatFloat(v.Float(), 'g', -1, bits), nil }, nil
	case reflect.Complex64, reflect.Complex128:
		bits := typ.Bits()
		return func(v reflect.Value) (string, error) { return strconv.FormatComplex(v.Complex(), 'g', -1, bits), nil }, nil
	case reflect.Slice:
		if typ.Elem().Kind() == reflect.Uint8 {
			return func(v reflect.Value) (string, error) { return string(v.Bytes()), nil }, nil
		}
	}
	if implements(typ, stringerType) {
		return call(typ, stringerType, str), nil
	}
	return nil, fmt.Errorf("%s cannot be formatted: name a field of it, or give it a MarshalText or String method", typ)
}

// implements reports whether typ, or its pointer for a type that is neither a pointer nor an
// interface, implements iface.
func implements(typ, iface reflect.Type) bool {
	if typ.Implements(iface) {
		return true
	}
	k := typ.Kind()
	return k != reflect.Pointer && k != reflect.Interface && reflect.PointerTo(typ).Implements(iface)
}

// call returns a formatter that calls f with the value, as an any that implements iface: the
// value itself when typ implements iface, else a pointer to it. A nil interface or pointer —
// a typed nil in an interface too — is an error, and so is a panic in the method: a lock name
// that cannot be made, never a panic out of the decorated call.
func call(typ, iface reflect.Type, f func(any) (string, error)) formatter {
	byPointer := !typ.Implements(iface)
	isInterface := typ.Kind() == reflect.Interface
	nilable := isInterface || typ.Kind() == reflect.Pointer
	return func(v reflect.Value) (s string, err error) {
		if nilable && v.IsNil() || isInterface && v.Elem().Kind() == reflect.Pointer && v.Elem().IsNil() {
			return "", errNil
		}
		var x any
		switch {
		case byPointer && v.CanAddr() && v.Addr().CanInterface():
			x = v.Addr().Interface()
		case !v.CanInterface():
			return "", fmt.Errorf("%s is not accessible", typ)
		case byPointer:
			p := reflect.New(typ)
			p.Elem().Set(v)
			x = p.Interface()
		default:
			x = v.Interface()
		}
		defer func() {
			if recover() != nil {
				s, err = "", fmt.Errorf("the %s method of %T panicked", iface.Method(0).Name, x)
			}
		}()
		return f(x)
	}
}
