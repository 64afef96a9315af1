package decoder

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// A relation whose tenant column the publication leaves out: every row
// change becomes a quarantine entry with neither tenant nor key, so it is
// routed to no tenant; a truncate (no row data) and relations that are
// genuinely untenanted are unaffected.
func TestUnscopedRelationQuarantined(t *testing.T) {
	asked := map[string]int{}
	f := newFeeder(t, Config{TenantColumn: "org", Unscoped: func(_ uint32, schema, table string) (bool, error) {
		asked[schema+"."+table]++
		return table == "users", nil
	}})
	f.feed(
		beginMsg(700, 0x1F00),
		relationMsg(false, 0, 1, "public", "users", 'd', col{"id", 23, true}, col{"email", 25, false}),
		relationMsg(false, 0, 2, "public", "plain", 'd', col{"id", 23, true}),
		relationMsg(false, 0, 3, "public", "docs", 'd', col{"id", 23, true}, col{"org", 25, false}),
		insertMsg(false, 0, 1, "1", "a@example.com"),
		updateMsg(false, 0, 1, 0, nil, "1", "b@example.com"),
		deleteMsg(false, 0, 1, 'K', "1", nil),
		insertMsg(false, 0, 2, "7"),
		insertMsg(false, 0, 3, "1", "acme"),
		commitMsg(0x1F00, 0x2000),
	)
	if asked["public.users"] != 1 || asked["public.plain"] != 1 || asked["public.docs"] != 0 {
		t.Fatalf("Unscoped asked %v; want once for each relation without the tenant column, never for one with it", asked)
	}
	cs := takeChanges(t, f)
	if len(cs) != 5 {
		t.Fatalf("%d changes, want 5", len(cs))
	}
	for i, c := range cs[:3] {
		if c.Op != OpQuarantine || c.TenantState != TenantUnresolved || c.Tenant != "" || len(c.Key) != 0 {
			t.Fatalf("change %d of the unscoped table: op %s, tenant state %d %q, key %s; want a quarantine entry with no tenant and no key", i, c.Op, c.TenantState, c.Tenant, c.Key)
		}
		var env Envelope
		if err := json.Unmarshal(c.Body, &env); err != nil {
			t.Fatal(err)
		}
		if env.Quarantine == nil || env.Quarantine.Reason != ReasonTenantUnscoped || env.Key != nil || env.Tenant != "" || env.After != nil {
			t.Fatalf("change %d: %s", i, c.Body)
		}
		if strings.Contains(string(c.Body), "example.com") {
			t.Fatalf("change %d carries row values in the clear: %s", i, c.Body)
		}
	}
	if cs[3].Op != OpInsert || cs[3].TenantState != TenantNone || cs[4].Op != OpInsert || cs[4].Tenant != "acme" {
		t.Fatalf("other tables' changes: %+v %+v", cs[3], cs[4])
	}
}

// A failed answer ends Decode with it: no change of the relation is
// decoded unscoped by guess.
func TestUnscopedLookupFails(t *testing.T) {
	boom := errors.New("catalog unreadable")
	d := New(Config{TenantColumn: "org", Unscoped: func(uint32, string, string) (bool, error) { return false, boom }})
	defer d.Close()
	if err := d.Decode(0x10, relationMsg(false, 0, 1, "public", "users", 'd', col{"id", 23, true})); !errors.Is(err, boom) {
		t.Fatalf("Decode = %v, want the lookup's error", err)
	}
}
