package redistest

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that the helpers leave no goroutine behind: every process
// waiter and every client they make must be stopped by the cleanups.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, LeakOptions()...) }
