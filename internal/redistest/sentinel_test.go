package redistest

import (
	"net"
	"testing"
)

func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st := StartSentinel(t)
	old, replica := st.Master(), st.Replica()
	addr, err := st.admin.GetMasterAddrByName(ctx, st.MasterName()).Result()
	if err != nil || net.JoinHostPort(addr[0], addr[1]) != old.Addr() {
		t.Fatalf("sentinel reports master %v, %v; want %s", addr, err, old.Addr())
	}

	c := st.Client()
	if err := c.Set(ctx, "sentinel:key", "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	promoted := st.Failover(t)
	if promoted != replica || st.Master() != replica || st.Replica() != nil {
		t.Fatalf("Failover promoted %s; Master %s, Replica %v", promoted.Addr(), st.Master().Addr(), st.Replica())
	}
	if old.Running() {
		t.Fatal("the old master still runs")
	}
	err = retry(ctx, func() error { return c.Set(ctx, "sentinel:key", "after", 0).Err() })
	if err != nil {
		t.Fatalf("write after failover: %v", err)
	}
	if v, err := promoted.Do(ctx, "GET", "sentinel:key"); err != nil || v != "after" {
		t.Fatalf("GET on the promoted master: %v, %v", v, err)
	}
}
