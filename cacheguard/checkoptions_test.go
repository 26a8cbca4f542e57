package cacheguard_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// Guard.CheckCallOptions refuses exactly what a Get refuses because of its
// options, against the Guard's own defaults (values, tags, a nil option),
// and reports ErrClosed once the Guard is closed. ginmw.Cache checks its
// options with it when it is built.
func TestCheckCallOptionsIsTheGetsCheck(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t, cacheguard.LoadTimeout(time.Second))
	tooMany := make([]string, 17)
	for i := range tooMany {
		tooMany[i] = fmt.Sprint("t", i)
	}
	for _, tc := range []struct {
		what    string
		opts    []cacheguard.CallOption
		refused bool
	}{
		{"none", nil, false},
		{"negative load timeout", []cacheguard.CallOption{cacheguard.LoadTimeout(-time.Second)}, true},
		{"zero TTL", []cacheguard.CallOption{cacheguard.TTL(0)}, true},
		{"jitter 1", []cacheguard.CallOption{cacheguard.Jitter(1)}, true},
		{"lease below MinLease", []cacheguard.CallOption{cacheguard.Lease(time.Millisecond)}, true},
		{"TTL past MaxDuration", []cacheguard.CallOption{cacheguard.TTL(cacheguard.MaxDuration + 1)}, true},
		{"an empty tag", []cacheguard.CallOption{cacheguard.Tags("repos", "")}, true},
		{"17 tags", []cacheguard.CallOption{cacheguard.Tags(tooMany...)}, true},
		{"a nil option", []cacheguard.CallOption{cacheguard.TTL(time.Minute), nil}, true},
		{"valid ones", []cacheguard.CallOption{cacheguard.Tags("repos"), cacheguard.ServeStale(time.Minute), cacheguard.Variant("HEAD")}, false},
	} {
		checkErr := g.CheckCallOptions(tc.opts...)
		_, getErr := cacheguard.Get(ctx, g, testKey(t, tc.what), func(context.Context) (int, error) { return 1, nil }, tc.opts...)
		if errors.Is(checkErr, cacheguard.ErrInvalid) != tc.refused || errors.Is(getErr, cacheguard.ErrInvalid) != tc.refused {
			t.Errorf("%s: CheckCallOptions %v, Get %v; refused: want %v", tc.what, checkErr, getErr, tc.refused)
		}
		if !tc.refused && checkErr != nil {
			t.Errorf("%s: CheckCallOptions %v, want nil", tc.what, checkErr)
		}
	}
	g.Close()
	if err := g.CheckCallOptions(); !errors.Is(err, cacheguard.ErrClosed) {
		t.Errorf("closed Guard: %v, want ErrClosed", err)
	}
}
