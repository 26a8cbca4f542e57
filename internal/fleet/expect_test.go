package fleet

// expectFail lists the issue items whose defects the suite reproduces on
// today's main and whose fixes have not merged yet: their rows print their
// counts without failing the run. Remove an item when its fix merges; the
// table's last line names the items that did not reproduce in a run.
var expectFail = map[string]string{
	"30.6-cacheguard": "cacheguard's commands wait out a 5s stall: its CommandTimeout defaults to 5s (a 500ms default halved the real-database mix's throughput and was reverted in 7972932) and a read's HGET runs outside internal/rcmd (an edit waits in gormplugin's invalidation through cacheguard.Invalidate); issue 30",
}
