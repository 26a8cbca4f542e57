package fleet

import (
	"testing"
	"time"
)

// testControls are the negative controls: with a protection switched
// off (the service's test-only -control), the scenario it protects against
// must show violations, or the suite could not see them either. The write
// controls run on PostgreSQL: on SQLite the paused holder's transaction
// holds the database-wide write lock (BEGIN IMMEDIATE), so the next holder
// cannot read before it commits and no update is lost even unguarded.
func testControls(t *testing.T) {
	t.Run("no-plugin", func(t *testing.T) {
		// Without gormplugin, only ginmw.Lock orders the edits: a holder
		// paused past its lease after its read writes over the next
		// holder's edit.
		f := Start(t, Config{Procs: 2, DB: "postgres", Control: "no-plugin"})
		ctx := t.Context()
		s := f.Scenario(t, rep, "control: plugin unregistered, holder SIGSTOPped after its read")
		a, b, err := f.PauseEdit(ctx, Pause{Step: StepAfterRead, P: 0, Q: 1, Repo: f.FreshRepo(), For: f.Cfg.Lease + 1500*time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		v := s.EditViolations(ctx)
		s.Control(InvLost, len(v[InvLost]), v[InvLost]...)
		s.Figure("the paused edit", a.answer())
		s.Figure("the other edit", b.answer())
		s.Done()
	})
	t.Run("no-fencing", func(t *testing.T) {
		// With gormplugin.NoFencing, a holder paused past its lease after
		// the plugin's checks and before its UPDATE writes over the next
		// holder's edit: only the fence condition (and the version the
		// fence gives the struct read) would have refused it. The paused
		// edit is a rename (plain GORM calls): a settings edit's
		// gormplugin.Transaction claims the row first, and the next
		// holder would wait for its COMMIT, fence or not.
		f := Start(t, Config{Procs: 2, DB: "postgres", Control: "no-fencing"})
		ctx := t.Context()
		s := f.Scenario(t, rep, "control: fencing off, holder SIGSTOPped before its UPDATE")
		a, b, err := f.PauseEdit(ctx, Pause{Step: StepBeforeUpdate, P: 0, Q: 1, Repo: f.FreshRepo(), For: f.Cfg.Lease + 1500*time.Millisecond, Rename: true, IgnoreLost: true})
		if err != nil {
			t.Fatal(err)
		}
		rows, err := f.Rows(ctx)
		if err != nil {
			t.Fatal(err)
		}
		landed := 0
		if row := rows[a.Repo]; len(row.Settings.Edits) > 0 && row.Settings.Edits[len(row.Settings.Edits)-1] == a.ID && b.Status == 200 {
			landed = 1 // the paused write came last, over an edit acknowledged meanwhile
		}
		s.Control("paused holder's write landed after the next holder's", landed, a.String(), b.String())
		s.Figure("the paused edit", a.answer())
		s.Figure("the other edit", b.answer())
		s.Done()
	})
	t.Run("no-invalidate", func(t *testing.T) {
		// Without invalidation after COMMIT, a read after an acknowledged
		// edit is served the cached copy from before it.
		f := Start(t, Config{Procs: 2, Control: "no-invalidate"})
		ctx := t.Context()
		s := f.Scenario(t, rep, "control: invalidation off, reads after an edit")
		repo := f.FreshRepo()
		for p := range f.Procs() {
			f.Read(ctx, p, RouteGet, repo)
			f.Read(ctx, p, RouteList, repo)
		}
		f.Edit(ctx, 0, repo)
		for p := range f.Procs() {
			f.Read(ctx, p, RouteGet, repo)
			f.Read(ctx, p, RouteList, repo)
		}
		stale, _, _ := f.Rec.violations(s.Name)
		var get, list []string
		for _, op := range stale {
			if op.Route == RouteGet {
				get = append(get, op.String())
			} else {
				list = append(list, op.String())
			}
		}
		s.Control(InvStaleGet, len(get), get...)
		s.Control(InvStaleCache, len(list), list...)
		s.Done()
	})
}
