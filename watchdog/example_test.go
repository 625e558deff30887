package watchdog_test

import (
	"fmt"
	"time"

	"github.com/guardlock/guard/watchdog"
)

// The deadline of a lock taken with the default 30 s lease by a request sent at start: the
// lease less 1% and 2 ms.
func ExampleDeadline() {
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	fmt.Println(watchdog.Drift(30 * time.Second))
	fmt.Println(watchdog.Deadline(start, 30*time.Second).Format(time.StampMilli))
	// Output:
	// 302ms
	// Nov 30 12:00:29.698
}
