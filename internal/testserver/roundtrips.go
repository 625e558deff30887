package testserver

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// RoundTrips counts the network round trips of a go-redis client: one per command, one per
// pipeline. On a ClusterClient it counts on every node's client, where go-redis runs each
// node's share of a pipeline as a pipeline of its own: a pipeline then counts one round trip
// per node it reaches. Commands that go-redis or a Store sends for its own bookkeeping — the
// cluster topology, the command table, connection set-up, health checks, a Store's one look
// at the server's eviction policy — do not count: they are not the lock operations.
type RoundTrips struct {
	n     atomic.Int64 // round trips
	calls atomic.Int64 // commands and pipelines sent through the client itself
}

// CountRoundTrips hooks a new counter into c.
func CountRoundTrips(c redis.UniversalClient) *RoundTrips {
	r := &RoundTrips{}
	c.AddHook(roundTripHook{&r.calls})
	if cc, ok := c.(*redis.ClusterClient); ok {
		cc.OnNewNode(func(node *redis.Client) { node.AddHook(roundTripHook{&r.n}) })
		return r
	}
	c.AddHook(roundTripHook{&r.n})
	return r
}

// Load returns the round trips counted so far.
func (r *RoundTrips) Load() int64 { return r.n.Load() }

// Calls returns the commands and pipelines sent through the client itself so far: on a
// ClusterClient, a pipeline counts once however many nodes it reaches.
func (r *RoundTrips) Calls() int64 { return r.calls.Load() }

// roundTripHook counts the Process and ProcessPipeline calls of the client it hooks.
type roundTripHook struct{ n *atomic.Int64 }

func (h roundTripHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h roundTripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !bookkeeping(cmd) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h roundTripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if !bookkeeping(cmd) {
				h.n.Add(1)
				break
			}
		}
		return next(ctx, cmds)
	}
}

// bookkeeping reports whether cmd was sent for the client's or the Store's own bookkeeping.
func bookkeeping(cmd redis.Cmder) bool {
	switch strings.ToLower(cmd.Name()) {
	case "cluster", "command", "hello", "client", "auth", "select", "readonly", "ping", "info":
		return true
	}
	return false
}

// EachNode calls f with a client of each address in turn, and closes it after.
func EachNode(addrs []string, f func(c *redis.Client) error) error {
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		err := f(c)
		_ = c.Close()
		if err != nil {
			return err
		}
	}
	return nil
}
