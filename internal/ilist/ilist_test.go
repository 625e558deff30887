package ilist

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
)

type item struct {
	v     int
	links Links[item]
}

func values(l *List[item]) []int {
	var out []int
	for e := l.Front(); e != nil; e = l.Next(e) {
		out = append(out, e.v)
	}
	return out
}

func TestList(t *testing.T) {
	l := New(func(i *item) *Links[item] { return &i.links })
	items := make([]*item, 5)
	for i := range items {
		items[i] = &item{v: i}
		l.Push(items[i])
	}
	assert.Equal(t, []int{4, 3, 2, 1, 0}, values(&l))
	assert.True(t, l.Remove(items[2]), "the middle")
	assert.True(t, l.Remove(items[4]), "the front")
	assert.True(t, l.Remove(items[0]), "the back")
	assert.False(t, l.Remove(items[0]), "twice")
	assert.Equal(t, []int{3, 1}, values(&l))
	assert.Equal(t, 2, l.Len())

	// Removing while walking, as the scheduler does.
	for e, next := l.Front(), (*item)(nil); e != nil; e = next {
		next = l.Next(e)
		l.Remove(e)
	}
	assert.Zero(t, l.Len())
	assert.Nil(t, l.Front())
	l.Push(items[0])
	assert.True(t, slices.Equal([]int{0}, values(&l)))
}
