package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"
)

// DBEnv picks the soak's database: sqlite (the default) or postgres.
const DBEnv = "FLEET_DB"

// soakFault is one kind of fault the soak's nemesis draws.
type soakFault struct {
	name     string
	weight   int
	issues   Issues
	failOK   bool // reads may fail while it is on (503 is documented)
	run      func(ctx context.Context, f *Fleet, rng *rand.Rand) error
	recovers bool // measure the first successful edit after it
}

// soakFaults is the nemesis's repertoire.
func soakFaults() []soakFault {
	var out []soakFault
	for _, step := range WriteSteps {
		for _, ignore := range []bool{false, true} {
			name := "holder SIGSTOPped at " + step
			if ignore {
				name += ", ignoring lock loss"
			}
			out = append(out, soakFault{name: name, weight: 2, issues: pauseIssues(step), run: func(ctx context.Context, f *Fleet, rng *rand.Rand) error {
				p, q := twoProcs(rng, f.Procs())
				pz := drawKind(rng)
				pz.Step, pz.P, pz.Q, pz.Repo = step, p, q, f.soakRepo(rng)
				pz.For, pz.IgnoreLost = f.Cfg.Lease+time.Duration(500+rng.IntN(2000))*time.Millisecond, ignore
				_, _, err := f.PauseEdit(ctx, pz)
				return err
			}})
		}
	}
	for _, route := range []string{RouteGet, RouteList} {
		out = append(out, soakFault{name: "cache load SIGSTOPped, " + route + " route", weight: 2, issues: readIssues, run: func(ctx context.Context, f *Fleet, rng *rand.Rand) error {
			p, q := twoProcs(rng, f.Procs())
			return f.PauseLoad(ctx, LoadPause{Route: route, P: p, Q: q, Repo: f.soakRepo(rng), For: f.Cfg.Lease + time.Duration(rng.IntN(2000))*time.Millisecond, Late: rng.IntN(3)})
		}})
	}
	out = append(out,
		soakFault{name: "holder SIGKILLed after its read", weight: 2, run: func(ctx context.Context, f *Fleet, rng *rand.Rand) error {
			p, q := twoProcs(rng, f.Procs())
			kz := drawKind(rng)
			kz.P, kz.Q, kz.Repo = p, q, f.soakRepo(rng)
			_, _, _, err := f.KillEdit(ctx, kz)
			return err
		}},
		soakFault{name: "redis-server killed, 1s outage", weight: 2, failOK: true, recovers: true, run: func(ctx context.Context, f *Fleet, _ *rand.Rand) error {
			return f.RedisOutage(ctx, time.Second)
		}},
		soakFault{name: "redis-server killed, 4s outage", weight: 2, failOK: true, recovers: true, run: func(ctx context.Context, f *Fleet, _ *rand.Rand) error {
			return f.RedisOutage(ctx, 4*time.Second)
		}},
		soakFault{name: "redis-server killed, 30s outage", weight: 1, failOK: true, recovers: true, run: func(ctx context.Context, f *Fleet, _ *rand.Rand) error {
			return f.RedisOutage(ctx, 30*time.Second)
		}},
		soakFault{name: "redis-server SIGSTOPped 2s", weight: 2, failOK: true, recovers: true, run: func(ctx context.Context, f *Fleet, _ *rand.Rand) error {
			f.RedisPause(ctx, 2*time.Second)
			return nil
		}},
		soakFault{name: "redis black-holed 2s", weight: 2, failOK: true, recovers: true, run: func(ctx context.Context, f *Fleet, _ *rand.Rand) error {
			f.BlackHole(ctx, 2*time.Second)
			return nil
		}},
		soakFault{name: "a process SIGTERMed and restarted", weight: 2, issues: Issues{InvReadErrors: {"22.1"}}, run: func(ctx context.Context, f *Fleet, rng *rand.Rand) error {
			p := rng.IntN(f.Procs())
			end := f.fault(fmt.Sprintf("process %d SIGTERMed and restarted", p))
			defer end()
			f.Proc(p).Term(15 * time.Second)
			return f.Restart(p)
		}},
		soakFault{name: "a process SIGKILLed and restarted", weight: 1, run: func(ctx context.Context, f *Fleet, rng *rand.Rand) error {
			p := rng.IntN(f.Procs())
			end := f.fault(fmt.Sprintf("process %d SIGKILLed and restarted", p))
			defer end()
			f.Proc(p).Kill()
			return f.Restart(p)
		}},
	)
	return out
}

func twoProcs(rng *rand.Rand, n int) (int, int) {
	p := rng.IntN(n)
	return p, (p + 1 + rng.IntN(n-1)) % n
}

// drawKind draws the kind of a faulted edit: a settings edit, a rename or a
// read-then-Save (see Pause).
func drawKind(rng *rand.Rand) Pause {
	k := rng.IntN(3)
	return Pause{Rename: k == 1, Save: k == 2}
}

// soakRepo draws a repository for a fault (the steady load keeps to 1-3).
func (f *Fleet) soakRepo(rng *rand.Rand) uint {
	return uint(seeded + 1 + rng.IntN(f.Cfg.Repos-seeded))
}

// TestFleetSoak runs a steady load while a nemesis injects faults drawn from
// a seeded schedule, for FLEET_SOAK (e.g. 10m), then checks every fault's
// window and prints the table. FLEET_SEED replays a schedule; FLEET_DB
// picks the database.
func TestFleetSoak(t *testing.T) {
	d := os.Getenv(SoakEnv)
	if d == "" {
		t.Skip("the soak runs with " + SoakEnv + "=<duration> (make soak)")
	}
	dur, err := time.ParseDuration(d)
	if err != nil || dur <= 0 {
		t.Fatalf("%s=%q: want a positive duration", SoakEnv, d)
	}
	db := os.Getenv(DBEnv)
	if db == "" {
		db = "sqlite"
	}
	fmt.Fprintf(os.Stderr, "fleet soak: %v on %s, seed %d (replay with %s=%d)\n", dur, db, rep.Seed, SeedEnv, rep.Seed)
	f := Start(t, Config{DB: db, Repos: 300})
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(uint64(rep.Seed), 1))
	faults := soakFaults()
	total := 0
	for _, ft := range faults {
		total += ft.weight
	}
	const steady = "soak: steady load between faults"
	f.Rec.Begin(steady)
	load := f.StartLoad(ctx, LoadConfig{Seed: uint64(rep.Seed), Writers: 3, Readers: 3, Repos: []uint{1, 2, 3}, Think: 20 * time.Millisecond, Mixed: true})
	injected := map[string]int{}
	recovery := map[string][]time.Duration{}
	for deadline := time.Now().Add(dur); time.Now().Before(deadline) && ctx.Err() == nil; {
		hold(ctx, time.Duration(1000+rng.IntN(3000))*time.Millisecond)
		n := rng.IntN(total)
		var ft soakFault
		for _, ft = range faults {
			if n -= ft.weight; n < 0 {
				break
			}
		}
		f.Rec.Begin("soak: " + ft.name)
		if err := ft.run(ctx, f, rng); err != nil {
			t.Errorf("soak (seed %d): %s: %v", rep.Seed, ft.name, err)
		}
		if ft.recovers {
			rec, ok := f.FirstEdit(ctx, recoverRepo, 60*time.Second)
			if !ok {
				t.Errorf("soak (seed %d): %s: no edit answered 200 within 60s", rep.Seed, ft.name)
			}
			recovery[ft.name] = append(recovery[ft.name], rec)
		}
		injected[ft.name]++
		f.Rec.Begin(steady)
	}
	load.Stop()

	ctx = context.WithoutCancel(ctx)
	for _, ft := range append([]soakFault{{name: steady[len("soak: "):]}}, faults...) {
		name := "soak: " + ft.name
		if injected[ft.name] == 0 && name != steady {
			continue
		}
		s := &Scenario{Name: name, F: f, t: t, rep: rep}
		if name != steady {
			s.Figure("injected", fmt.Sprint(injected[ft.name]))
		}
		if rs := recovery[ft.name]; len(rs) > 0 {
			slices.Sort(rs)
			s.Figure("recovery to the first edit answered 200 (median, max)", fmt.Sprintf("%v, %v", round(rs[len(rs)/2]), round(rs[len(rs)-1])))
		}
		s.CheckEdits(ctx, ft.issues)
		issues := readIssues
		if ft.issues[InvReadErrors] != nil {
			issues = Issues{InvStaleGet: {"14.1"}, InvStaleCache: {"14.1"}, InvBackwards: {"14.1"}, InvReadErrors: ft.issues[InvReadErrors]}
		}
		s.CheckReads(issues, ft.failOK || name == steady)
		s.Done()
	}
	s := &Scenario{Name: "soak: processes", F: f, t: t, rep: rep}
	s.CheckProcs(nil)
	s.Figure("cross-process backwards reads of one reader (not guaranteed)", fmt.Sprint(load.crossBackwards.Load()))
	s.Done()
}
