package redistest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
)

// migrateTimeout is MIGRATE's per-call I/O timeout, in milliseconds.
const migrateTimeout = 5000

// Migration is a slot move in progress, started by BeginMigration. While it
// lasts, the source answers ASK for keys of the slot it no longer holds and
// the target serves them after ASKING, as during a real resharding.
type Migration struct {
	c        *Cluster
	slot     int
	from, to *Server
}

// MigrateSlot moves slot, keys included, from the master that serves it to
// master to, and returns once every live node sees slot on to. It is
// BeginMigration followed by Finish.
func (c *Cluster) MigrateSlot(ctx context.Context, slot int, to *Server) error {
	m, err := c.BeginMigration(ctx, slot, to)
	if err != nil {
		return err
	}
	return m.Finish(ctx)
}

// BeginMigration starts moving slot from the master that serves it to master
// to: CLUSTER SETSLOT IMPORTING on to, then MIGRATING on the source. No key
// moves until MoveKeys or Finish.
func (c *Cluster) BeginMigration(ctx context.Context, slot int, to *Server) (*Migration, error) {
	if slot < 0 || slot >= clusterSlots {
		return nil, fmt.Errorf("redistest: slot %d out of range", slot)
	}
	if !slices.Contains(c.Masters(), to) {
		return nil, fmt.Errorf("redistest: migrate slot %d: %s is not a current master", slot, to.Addr())
	}
	from, err := c.masterForSlot(ctx, slot)
	if err != nil {
		return nil, err
	}
	if from == to {
		return nil, fmt.Errorf("redistest: slot %d is already on %s", slot, to.Addr())
	}
	if err := c.setSlot(ctx, to, slot, "IMPORTING", c.ids[from]); err != nil {
		return nil, err
	}
	if err := c.setSlot(ctx, from, slot, "MIGRATING", c.ids[to]); err != nil {
		return nil, err
	}
	return &Migration{c: c, slot: slot, from: from, to: to}, nil
}

func (c *Cluster) setSlot(ctx context.Context, s *Server, slot int, state, id string) error {
	if err := c.admin[s].Do(ctx, "CLUSTER", "SETSLOT", slot, state, id).Err(); err != nil {
		return fmt.Errorf("redistest: CLUSTER SETSLOT %d %s on %s: %w", slot, state, s.Addr(), err)
	}
	return nil
}

// Slot is the slot being moved.
func (m *Migration) Slot() int { return m.slot }

// From is the master the slot is moving away from.
func (m *Migration) From() *Server { return m.from }

// To is the master the slot is moving to.
func (m *Migration) To() *Server { return m.to }

// MoveKeys moves the named keys of the slot to the target with MIGRATE. Keys
// that do not exist on the source are skipped; a key of another slot is an
// error.
func (m *Migration) MoveKeys(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	args := []any{"MIGRATE", "127.0.0.1", m.to.Port(), "", 0, migrateTimeout, "KEYS"}
	for _, k := range keys {
		if s := keySlot(k); s != m.slot {
			return fmt.Errorf("redistest: key %q is in slot %d, not %d", k, s, m.slot)
		}
		args = append(args, k)
	}
	if err := m.c.admin[m.from].Do(ctx, args...).Err(); err != nil {
		return fmt.Errorf("redistest: MIGRATE to %s on %s: %w", m.to.Addr(), m.from.Addr(), err)
	}
	return nil
}

// Finish moves the keys still on the source, assigns the slot to the target
// with CLUSTER SETSLOT NODE on the target, the source and the other masters,
// and waits until every live node sees the slot on the target.
func (m *Migration) Finish(ctx context.Context) error {
	c := m.c
	for {
		keys, err := c.admin[m.from].ClusterGetKeysInSlot(ctx, m.slot, 100).Result()
		if err != nil {
			return fmt.Errorf("redistest: CLUSTER GETKEYSINSLOT on %s: %w", m.from.Addr(), err)
		}
		if len(keys) == 0 {
			break
		}
		if err := m.MoveKeys(ctx, keys...); err != nil {
			return err
		}
	}
	order := []*Server{m.to, m.from}
	for _, s := range c.Masters() {
		if s != m.to && s != m.from && s.Running() {
			order = append(order, s)
		}
	}
	for _, s := range order {
		if err := c.setSlot(ctx, s, m.slot, "NODE", c.ids[m.to]); err != nil {
			return err
		}
	}
	return c.waitSlotOwner(ctx, m.slot, m.to)
}

// String describes the migration, e.g. "slot 42 127.0.0.1:12001->127.0.0.1:12002".
func (m *Migration) String() string {
	return "slot " + strconv.Itoa(m.slot) + " " + m.from.Addr() + "->" + m.to.Addr()
}
