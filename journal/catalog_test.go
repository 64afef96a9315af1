package journal

import (
	"errors"
	"testing"

	"github.com/walcast/walcast/decoder"
)

func catalogEntry() CatalogEntry {
	return CatalogEntry{
		Table: Table{Schema: "public", Name: "users"}, Published: true, RelID: 16384, ReplicaIdentity: IdentityDefault,
		TenantColumn: "org", RowFilter: "(active = true)", TableShape: "shape-1",
		Columns: []CatalogColumn{
			{Name: "id", TypeOID: 20, NotNull: true, Key: true, PrimaryKey: true},
			{Name: "org", TypeOID: 25},
			{Name: "mood", TypeOID: 16500, BaseSchema: "public", BaseName: "mood"},
			{Name: "tags", TypeOID: 16600, BaseSchema: "public", BaseName: "_label", ElementSchema: "pg_catalog", ElementName: "text", ElementDelim: ','},
		},
	}
}

// A table's entry round-trips whole, an unchanged entry writes no version,
// and every change is a new version with the old ones kept.
func TestCatalogVersions(t *testing.T) {
	j, gen, _ := newJournal(t)
	ctx := testCtx(t)
	tbl := Table{Schema: "public", Name: "users"}
	if _, ok, err := j.Catalog(ctx, tbl); err != nil || ok {
		t.Fatalf("Catalog of an unknown table: ok %v, err %v; want no entry", ok, err)
	}
	e := catalogEntry()
	v, wrote, err := j.RecordCatalog(ctx, gen, e)
	if err != nil || v != 1 || !wrote {
		t.Fatalf("first RecordCatalog: version %d, wrote %v, err %v; want 1, true", v, wrote, err)
	}
	got, ok, err := j.Catalog(ctx, tbl)
	if err != nil || !ok {
		t.Fatalf("Catalog: ok %v, err %v", ok, err)
	}
	want := e
	want.Version, want.Generation, want.RecordedAt = 1, gen, got.RecordedAt
	if got.RecordedAt.IsZero() || !got.sameAs(&want) || got.Version != 1 || got.Generation != gen {
		t.Fatalf("Catalog returned\n%+v\nwant\n%+v", got, want)
	}
	if k := got.KeyColumns(); len(k) != 1 || k[0] != "id" {
		t.Fatalf("KeyColumns = %v, want [id]", k)
	}
	infos := got.ColumnInfos()
	if infos[3].Element != (decoder.ArrayElement{Schema: "pg_catalog", Name: "text", Delim: ','}) || infos[2].BaseName != "mood" || !infos[0].PrimaryKey {
		t.Fatalf("ColumnInfos = %+v", infos)
	}

	if v, wrote, err := j.RecordCatalog(ctx, gen, e); err != nil || v != 1 || wrote {
		t.Fatalf("RecordCatalog of the same entry: version %d, wrote %v, err %v; want 1, false", v, wrote, err)
	}

	// The column list drops org: the tenant can no longer be known.
	e2 := e
	e2.Columns = []CatalogColumn{e.Columns[0], e.Columns[2], e.Columns[3]}
	e2.TenantUnscoped = true
	if v, wrote, err := j.RecordCatalog(ctx, gen, e2); err != nil || v != 2 || !wrote {
		t.Fatalf("RecordCatalog of a changed entry: version %d, wrote %v, err %v; want 2, true", v, wrote, err)
	}
	got, _, err = j.Catalog(ctx, tbl)
	if err != nil || got.Version != 2 || !got.TenantUnscoped || len(got.Columns) != 3 {
		t.Fatalf("newest entry after the change: %+v, err %v", got, err)
	}
	hist, err := j.CatalogHistory(ctx, tbl)
	if err != nil || len(hist) != 2 || hist[0].Version != 1 || hist[0].TenantUnscoped || hist[1].Version != 2 {
		t.Fatalf("CatalogHistory = %+v, err %v; want versions 1 and 2, the first as written", hist, err)
	}

	// Another table, and the list of newest entries.
	o := catalogEntry()
	o.Name, o.TenantColumn, o.RowFilter = "orders", "", ""
	if _, _, err := j.RecordCatalog(ctx, gen, o); err != nil {
		t.Fatal(err)
	}
	all, err := j.CatalogTables(ctx)
	if err != nil || len(all) != 2 || all[0].Name != "orders" || all[1].Name != "users" || all[1].Version != 2 || all[0].TenantColumn != "" {
		t.Fatalf("CatalogTables = %+v, err %v", all, err)
	}
}

// Old versions beyond CatalogKeepVersions are pruned, the newest never.
func TestCatalogPrunesOldVersions(t *testing.T) {
	j, gen, _ := newJournal(t)
	ctx := testCtx(t)
	e := catalogEntry()
	n := CatalogKeepVersions + 5
	for i := 1; i <= n; i++ {
		e.RelID = uint32(20000 + i)
		if v, _, err := j.RecordCatalog(ctx, gen, e); err != nil || v != int64(i) {
			t.Fatalf("version %d: got %d, err %v", i, v, err)
		}
	}
	hist, err := j.CatalogHistory(ctx, e.Table)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != CatalogKeepVersions || hist[0].Version != int64(n-CatalogKeepVersions+1) || hist[len(hist)-1].Version != int64(n) {
		t.Fatalf("kept %d versions (%d..%d), want the newest %d", len(hist), hist[0].Version, hist[len(hist)-1].Version, CatalogKeepVersions)
	}
	if got, _, _ := j.Catalog(ctx, e.Table); got.RelID != uint32(20000+n) {
		t.Fatalf("newest entry has relid %d, want %d", got.RelID, 20000+n)
	}
}

// A replicator that lost the journal to a newer one writes nothing.
func TestCatalogFenced(t *testing.T) {
	j, gen, _ := newJournal(t)
	ctx := testCtx(t)
	if _, err := j.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	_, _, err := j.RecordCatalog(ctx, gen, catalogEntry())
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("RecordCatalog with an old generation: err %v, want ErrFenced", err)
	}
	if _, ok, err := j.Catalog(ctx, Table{Schema: "public", Name: "users"}); err != nil || ok {
		t.Fatalf("a fenced write left an entry (ok %v, err %v)", ok, err)
	}
}
