package redistest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id     string
	addr   string          // host:port, bus port left out
	flags  map[string]bool // myself, master, slave, fail?, fail, handshake, noaddr, ...
	master string          // the master's ID for a replica, "-" for a master
	slots  []string        // owned slots as listed ("0-5460", "7"); migration markers left out
}

// owns reports whether n serves slot.
func (n clusterNode) owns(slot int) bool {
	for _, f := range n.slots {
		lo, hi, isRange := strings.Cut(f, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			continue
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				continue
			}
		}
		if a <= slot && slot <= b {
			return true
		}
	}
	return false
}

// parseClusterNodes parses a CLUSTER NODES reply into a map keyed by node ID.
func parseClusterNodes(text string) (map[string]clusterNode, error) {
	out := map[string]clusterNode{}
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("redistest: bad CLUSTER NODES line %q", line)
		}
		n := clusterNode{id: f[0], master: f[3], flags: map[string]bool{}}
		n.addr, _, _ = strings.Cut(f[1], "@")
		for _, fl := range strings.Split(f[2], ",") {
			n.flags[fl] = true
		}
		for _, sl := range f[8:] {
			if !strings.HasPrefix(sl, "[") { // "[5-<-id]" and "[5->-id]" mark migrations
				n.slots = append(n.slots, sl)
			}
		}
		out[n.id] = n
	}
	return out, nil
}

func (c *Cluster) clusterNodes(ctx context.Context, s *Server) (map[string]clusterNode, error) {
	text, err := c.admin[s].ClusterNodes(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("redistest: CLUSTER NODES on %s: %w", s.Addr(), err)
	}
	return parseClusterNodes(text)
}

// WaitStable waits until every live node
//   - reports cluster_state:ok with all 16384 slots served by healthy masters,
//   - lists every live node in the role the Cluster expects (a replica under its
//     master), none of them flagged fail, fail?, handshake or noaddr,
//   - agrees with every other live node on which master serves which slot,
//
// and every live replica reports master_link_status:up. It checks every 20 ms
// until ctx is done, then returns an error that wraps ctx.Err() and names the
// last unmet condition.
func (c *Cluster) WaitStable(ctx context.Context) error {
	return poll(ctx, "a stable cluster", c.stable)
}

func (c *Cluster) stable(ctx context.Context) error {
	c.mu.Lock()
	want := map[string]string{} // live node ID -> its master's ID, "-" for a master
	for _, m := range c.masters {
		want[c.ids[m]] = "-"
	}
	for m, r := range c.replicaOf {
		want[c.ids[r]] = c.ids[m]
	}
	c.mu.Unlock()
	live := c.live()
	for id := range want {
		if s := c.byID(id); !slices.Contains(live, s) {
			delete(want, id)
		}
	}

	var agreed string // the first node's slot map
	for _, s := range live {
		if _, known := want[c.ids[s]]; !known {
			continue // e.g. a killed master restarted by the test: not ours to judge
		}
		info, err := c.admin[s].ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("CLUSTER INFO on %s: %w", s.Addr(), err)
		}
		ci := ParseInfo(info)
		if ci["cluster_state"] != "ok" || ci["cluster_slots_ok"] != strconv.Itoa(clusterSlots) {
			return fmt.Errorf("%s: cluster_state:%s cluster_slots_ok:%s", s.Addr(), ci["cluster_state"], ci["cluster_slots_ok"])
		}
		nodes, err := c.clusterNodes(ctx, s)
		if err != nil {
			return err
		}
		for id, master := range want {
			n, ok := nodes[id]
			switch {
			case !ok:
				return fmt.Errorf("%s does not know node %s", s.Addr(), id)
			case n.flags["fail"] || n.flags["fail?"] || n.flags["handshake"] || n.flags["noaddr"]:
				return fmt.Errorf("%s sees %s as %v", s.Addr(), n.addr, n.flags)
			case master == "-" && !n.flags["master"]:
				return fmt.Errorf("%s does not see %s as a master yet", s.Addr(), n.addr)
			case master != "-" && (!n.flags["slave"] || n.master != master):
				return fmt.Errorf("%s does not see %s as a replica of %s yet", s.Addr(), n.addr, master)
			}
		}
		var view []string
		for id, n := range nodes {
			if len(n.slots) == 0 {
				continue
			}
			if want[id] != "-" {
				return fmt.Errorf("%s sees slots on %s, which is not a current master", s.Addr(), n.addr)
			}
			view = append(view, id+":"+strings.Join(n.slots, ","))
		}
		slices.Sort(view)
		v := strings.Join(view, " ")
		if agreed == "" {
			agreed = v
		} else if v != agreed {
			return fmt.Errorf("nodes disagree on the slot map: %s vs %s", agreed, v)
		}
		if want[c.ids[s]] != "-" {
			info, err := c.admin[s].Info(ctx, "replication").Result()
			if err != nil {
				return fmt.Errorf("INFO on %s: %w", s.Addr(), err)
			}
			if st := ParseInfo(info)["master_link_status"]; st != "up" {
				return fmt.Errorf("replica %s: master_link_status:%s", s.Addr(), st)
			}
		}
	}
	return nil
}

// waitSlotOwner waits until every live node of c says owner serves slot.
func (c *Cluster) waitSlotOwner(ctx context.Context, slot int, owner *Server) error {
	what := fmt.Sprintf("every node to see slot %d on %s", slot, owner.Addr())
	return poll(ctx, what, func(ctx context.Context) error {
		for _, s := range c.live() {
			nodes, err := c.clusterNodes(ctx, s)
			if err != nil {
				return err
			}
			if !nodes[c.ids[owner]].owns(slot) {
				return fmt.Errorf("%s does not see slot %d on %s yet", s.Addr(), slot, owner.Addr())
			}
		}
		return nil
	})
}
