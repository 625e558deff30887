package guard

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBoundedContext: a release's context under a caller's context without a deadline keeps
// the caller's values, ignores its cancellation, and ends — with a cause, and for contexts
// derived from it — when the shared bound does.
func TestBoundedContext(t *testing.T) {
	type key struct{}
	caller, cancelCaller := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	bound, endBound := context.WithDeadline(context.Background(), time.Now().Add(time.Hour))
	c := boundedContext{Context: caller, bound: bound}
	child, cancelChild := context.WithCancel(c)
	defer cancelChild()

	cancelCaller()
	assert.Equal(t, "v", c.Value(key{}))
	require.NoError(t, c.Err(), "the caller's cancellation is ignored")
	require.NoError(t, child.Err())
	d, ok := c.Deadline()
	assert.True(t, ok)
	assert.WithinDuration(t, time.Now().Add(time.Hour), d, time.Minute)

	endBound()
	<-child.Done()
	assert.ErrorIs(t, c.Err(), context.Canceled)
	assert.True(t, errors.Is(context.Cause(c), context.Canceled))
	assert.ErrorIs(t, context.Cause(child), context.Canceled)
}

// TestReleaseBound: releases share one bound while it has more than releaseTimeout-boundStep
// left.
func TestReleaseBound(t *testing.T) {
	g := &Guard{}
	first := g.releaseBound()
	d, ok := first.Deadline()
	require.True(t, ok)
	assert.WithinDuration(t, time.Now().Add(releaseTimeout), d, boundStep)
	assert.Same(t, first, g.releaseBound())
}
