// Package ilist is an intrusive doubly linked list: each element carries its own links, so
// that adding one and taking it out cost neither a hash nor an allocation. The Guard keeps its
// held locks, and its scheduler its leases, in one.
package ilist

// Links are an element's place in a List. Embed them in the element; their zero value is an
// element in no list.
type Links[T any] struct {
	prev, next *T
	in         bool
}

// List is a list of *T whose links the accessor given to New finds in each element. Its
// methods are not safe for concurrent use.
type List[T any] struct {
	head  *T
	n     int
	links func(*T) *Links[T]
}

// New returns an empty list of elements whose links are at links(e).
func New[T any](links func(*T) *Links[T]) List[T] {
	return List[T]{links: links}
}

// Push puts e, which must be in no list, at the front.
func (l *List[T]) Push(e *T) {
	le := l.links(e)
	le.prev, le.next, le.in = nil, l.head, true
	if l.head != nil {
		l.links(l.head).prev = e
	}
	l.head = e
	l.n++
}

// Remove takes e out and reports whether it was in.
func (l *List[T]) Remove(e *T) bool {
	le := l.links(e)
	if !le.in {
		return false
	}
	if le.prev != nil {
		l.links(le.prev).next = le.next
	} else {
		l.head = le.next
	}
	if le.next != nil {
		l.links(le.next).prev = le.prev
	}
	*le = Links[T]{}
	l.n--
	return true
}

// Len returns the number of elements.
func (l *List[T]) Len() int { return l.n }

// Front returns the first element, or nil.
func (l *List[T]) Front() *T { return l.head }

// Next returns the element after e, or nil. Read it before removing e, to go on from there.
func (l *List[T]) Next(e *T) *T { return l.links(e).next }
