package bench

import (
	"strings"
	"testing"
)

func TestMeasureCosts(t *testing.T) {
	c := measureCosts()
	if c.Err != "" {
		t.Fatal(c.Err)
	}
	if c.Syscall <= 0 || c.WakeP50 <= 0 || c.WakeP99 < c.WakeP50 || c.SleepLate < 0 {
		t.Fatalf("implausible costs: %+v", c)
	}
	if s := c.String(); !strings.Contains(s, "wake-up round trip") {
		t.Fatalf("String() = %q", s)
	}
	t.Log(c)
}
