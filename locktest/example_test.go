package locktest_test

import (
	"testing"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/locktest"
	"github.com/guardlock/guard/memstore"
)

// A backend's conformance test: memstore's, which needs no server, so its harness reaches
// behind the holders' backs through the Store's own Inspector. A server backend's harness
// would use an admin client of the server instead.
func ExampleRun() {
	var t *testing.T // the test's
	s := memstore.New()
	locktest.Run(t, locktest.Harness{
		New: func(testing.TB) locktest.Target {
			return locktest.Target{Backend: s} // Guards share the Store, as instances share a server
		},
		Delete: func(tb testing.TB, name string) {
			if err := s.ForceRelease(tb.Context(), name, 0); err != nil {
				tb.Fatal(err)
			}
		},
		Overwrite: func(tb testing.TB, name string) {
			// Free it, then take it under another token for an hour.
			_ = s.ForceRelease(tb.Context(), name, 0)
			if _, err := s.Acquire(tb.Context(), guard.Request{Name: name, Token: "intruder", TTL: 3600e9}); err != nil {
				tb.Fatal(err)
			}
		},
		Wipe: func(testing.TB) {},
	})
}
