package replication

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/decoder"
	"github.com/walcast/walcast/journal"
)

// catalogOf returns table's newest catalog entry, failing the test when
// the journal cannot be read.
func catalogOf(t *testing.T, f *fixture, table string) (journal.CatalogEntry, bool) {
	t.Helper()
	e, ok, err := f.j.Catalog(context.Background(), journal.Table{Schema: "public", Name: table})
	if err != nil {
		t.Fatal(err)
	}
	return e, ok
}

// walcast run records every published table at start, a new version when
// a table's column list changes, and a Published false version when a
// table leaves the publication.
func TestCatalogRecorded(t *testing.T) {
	f := newFixture(t,
		`CREATE DOMAIN score AS int CHECK (VALUE >= 0)`,
		`CREATE TABLE users (id bigint PRIMARY KEY, org text, email text NOT NULL, password_hash text, s score)`,
		`ALTER PUBLICATION pub ADD TABLE users (id, org, email, s) WHERE (email <> '')`,
	)
	cfg := f.config()
	cfg.TenantColumn = "org"
	f.start(cfg)
	var e journal.CatalogEntry
	waitFor(t, "the catalog entry of public.users", 10*time.Second, func() bool {
		var ok bool
		e, ok = catalogOf(t, f, "users")
		return ok
	})
	var names []string
	for _, c := range e.Columns {
		names = append(names, c.Name)
	}
	if strings.Join(names, ",") != "id,org,email,s" || !e.Published || e.TenantColumn != "org" || e.TenantUnscoped ||
		e.RowFilter != "(email <> ''::text)" || e.ReplicaIdentity != journal.IdentityDefault || e.RelID == 0 || e.TableShape == "" {
		t.Fatalf("catalog entry: %+v", e)
	}
	if !e.Columns[0].Key || !e.Columns[0].NotNull || e.Columns[1].Key || !e.Columns[2].NotNull || e.Columns[3].BaseName != "int4" || e.Columns[3].BaseSchema != "pg_catalog" {
		t.Fatalf("columns: %+v", e.Columns)
	}
	if o, ok := catalogOf(t, f, "items"); !ok || o.TenantColumn != "" || len(o.Columns) != 3 {
		t.Fatalf("catalog entry of public.items: %+v (ok %v)", o, ok)
	}

	// The column list changes: a new version, the old one kept.
	execSQL(t, f.url, `ALTER PUBLICATION pub SET TABLE items, other, users (id, org, email)`)
	waitFor(t, "version 2 of public.users", 15*time.Second, func() bool {
		n, _ := catalogOf(t, f, "users")
		return n.Version == 2 && len(n.Columns) == 3 && n.RowFilter == ""
	})
	hist, err := f.j.CatalogHistory(context.Background(), journal.Table{Schema: "public", Name: "users"})
	if err != nil || len(hist) != 2 || len(hist[0].Columns) != 4 {
		t.Fatalf("history: %+v, err %v", hist, err)
	}

	// The table leaves the publication.
	execSQL(t, f.url, `ALTER PUBLICATION pub DROP TABLE users`)
	waitFor(t, "public.users recorded as unpublished", 15*time.Second, func() bool {
		n, _ := catalogOf(t, f, "users")
		return n.Version == 3 && !n.Published
	})
}

// A column list altered while running to leave out the tenant column:
// the table's changes are quarantined with no tenant and no key (journaled
// tenant-unknown, so no tenant-scoped or unscoped reader gets them), the
// catalog says the table is unscoped, its snapshots are refused with the
// fix, and the other tables stream on.
func TestCatalogUnscopedWhileRunning(t *testing.T) {
	f := newFixture(t,
		`CREATE TABLE docs (id int PRIMARY KEY, org text, body text)`,
		`ALTER PUBLICATION pub ADD TABLE docs`,
	)
	cfg := f.config()
	cfg.TenantColumn = "org"
	run := f.start(cfg)
	waitFor(t, "active", 10*time.Second, func() bool { return run.r.State().Role == RoleActive })
	execSQL(t, f.url, `INSERT INTO docs VALUES (1, 'acme', 'first')`)
	waitFor(t, "the first insert", 10*time.Second, func() bool { return len(f.entries()) == 1 })

	execSQL(t, f.url, `ALTER PUBLICATION pub SET TABLE items, other, docs (id, body)`,
		`INSERT INTO docs VALUES (2, 'acme', 'secret of acme')`,
		`UPDATE docs SET body = 'changed' WHERE id = 1`,
		`INSERT INTO items VALUES (1, 'x', 1)`)
	var es []journal.Entry
	waitFor(t, "the changes after the alter", 10*time.Second, func() bool { es = f.entries(); return len(es) == 4 })
	for _, e := range es[1:3] {
		if e.Op != decoder.OpQuarantine || !e.TenantUnknown || e.HasTenant {
			t.Fatalf("change of docs after its tenant column left the column list: op %s, tenant unknown %v, has tenant %v: %s", e.Op, e.TenantUnknown, e.HasTenant, e.Envelope)
		}
		if !strings.Contains(string(e.Envelope), decoder.ReasonTenantUnscoped) || strings.Contains(string(e.Envelope), "secret") {
			t.Fatalf("quarantine entry: %s", e.Envelope)
		}
	}
	if es[3].Op != decoder.OpInsert || es[3].Entity != "public.items" {
		t.Fatalf("other table's change: %+v", es[3])
	}
	for _, scope := range []journal.Query{{Entities: []string{"public.docs"}, Tenant: "acme"}, {Entities: []string{"public.docs"}}} {
		scope.FromOldest, scope.Limit = true, 100
		res, err := f.j.Changes(context.Background(), scope)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range res.Changes {
			if c.Op == decoder.OpQuarantine {
				t.Fatalf("reader scoped to tenant %q got the unscoped change %s", scope.Tenant, c.Envelope)
			}
		}
	}
	waitFor(t, "the catalog marking public.docs unscoped", 15*time.Second, func() bool {
		e, _ := catalogOf(t, f, "docs")
		return e.TenantUnscoped && e.TenantColumn == "org"
	})
	// A snapshot walcast run would take of it is refused likewise: its
	// read entries could not be scoped either.
	id, err := f.j.RequestSnapshot(context.Background(), journal.SnapshotRequest{Schema: "public", Table: "docs"})
	if err != nil {
		t.Fatal(err)
	}
	s := waitSnapshot(t, f, id, 30*time.Second)
	if s.Status != journal.SnapshotFailed || !strings.Contains(s.Error, "leaves it out of its column list") ||
		!strings.Contains(s.Error, `ALTER PUBLICATION "pub" DROP TABLE "public"."docs"; ALTER PUBLICATION "pub" ADD TABLE "public"."docs" ("id", "body", "org");`) {
		t.Fatalf("snapshot of the unscoped table: %s %q, want failed with the fix", s.Status, s.Error)
	}
}
