// Package reliability is cacheguard's failure-testing suite: it records
// histories of lock operations and fenced writes under crashes, pauses,
// partitions and lost replies, and checks them for linearizability with
// porcupine.
//
// The package holds only test helpers (porcupine models, a history recorder,
// the in-process TCP fault proxy of internal/faultproxy under short names, a
// fenced register, the figures table); the
// scenarios are its tests, all named TestReliability*, run with
//
//	go test -race -run Reliability ./internal/reliability
//
// (-short trims the longest). RELIABILITY_REPORT=path appends each
// scenario's figures to a Markdown table; RELIABILITY_OUT=dir writes every
// porcupine visualisation there (by default they are written to ./out only
// when a check disagrees with its expectation).
//
// # What is checked, and why it is sound
//
// Every operation is recorded with its call and return times on the test
// process's monotonic clock. A child process is driven one command at a time
// by the parent, which records the call before sending the command and the
// return after reading the answer, so the parent's clock brackets the child's
// operation. A call that failed in transit or timed out is recorded as
// unknown: it may take effect at any time after its call (return = Never).
//
// LockModel (lock history: acquire, release) checks mutual exclusion over
// leases and fence order. A grant is illegal while another holder's lease is
// surely still running: a lease granted by a call made at time c with lease L
// cannot end before c+L on the server, so a second grant that returned before
// c+L, with no release in between, is a violation; a grant returned after c+L
// is legal. Fences must increase with every grant. Only the holder can
// release. The leases in the workloads are fixed (NoRenewal) so that the
// model knows them; for holders that renew (child processes), the lease end is
// taken from PTTL read just before the fault, a lower bound of the server's
// expiry. The model checks safety only: refusals are always legal.
//
// RegisterModel (resource history: read, write) checks what fencing
// promises: a write with a token lower than one already applied fails, a
// write with a token at least as high is applied, reads see the last applied
// value, and a write made while its writer still held the lock by the
// writer's own reckoning (Lock.TTL, read just before the write) is never
// refused — that refusal would mean a later holder wrote while this one held
// the lock. The register lives on its own Redis server that no fault touches.
//
// Negative controls prove the checkers bite: a lock taken with SET without NX,
// a release that DELs without the token check, and a resource that ignores
// tokens are each flagged Illegal under the same workloads; a redis-server
// restarted without persistence and a Redlock node restarted empty at once
// reproduce their documented limitations. Their figures say so.
//
// Client-side clock jumps are covered by a source check: the locks package
// computes every deadline from time.Now readings, whose monotonic part a wall
// clock jump does not move (see TestReliabilityClockMonotonic).
package reliability
