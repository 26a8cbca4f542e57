package redistest

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
)

// logFirst is how many lines of each go-redis log format a test binary prints
// before it only counts them.
const logFirst = 3

// redisLog is the go-redis logger of every test binary that runs through Main:
// tests kill, pause and partition servers on purpose, and go-redis logs every
// failed dial, thousands of lines that once buried a failing test's own
// output. It prints the first few lines of each format and counts the rest,
// reported once when the tests end, so a failure stays readable and nothing
// go-redis says is lost without a trace.
type redisLog struct {
	mu     sync.Mutex
	counts map[string]int // format → lines seen
}

func (l *redisLog) Printf(_ context.Context, format string, v ...any) {
	l.mu.Lock()
	l.counts[format]++
	n := l.counts[format]
	l.mu.Unlock()
	if n <= logFirst {
		fmt.Fprintf(os.Stderr, "go-redis: "+format+"\n", v...)
	}
}

// summary writes how many lines of each format were not printed.
func (l *redisLog) summary() {
	l.mu.Lock()
	defer l.mu.Unlock()
	formats := make([]string, 0, len(l.counts))
	for f, n := range l.counts {
		if n > logFirst {
			formats = append(formats, f)
		}
	}
	sort.Strings(formats)
	for _, f := range formats {
		fmt.Fprintf(os.Stderr, "go-redis: %d more lines of %q not printed\n", l.counts[f]-logFirst, f)
	}
}
