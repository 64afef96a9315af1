package decoder

// column is one published column of a relation, in wire order.
type column struct {
	name    string
	jsonKey []byte // `"name":`, escaped
	typ     colType
	key     bool // part of the replica identity (every column under FULL)
}

// relation is the decoder's copy of the latest Relation message for an OID.
type relation struct {
	id       uint32
	entity   string // EntityName(schema, table)
	skip     bool   // a journal table (Config.SkipRelations): changes are dropped (DESIGN §4.10)
	cols     []column
	hasKey   bool
	fullKey  bool            // every column is a key column (REPLICA IDENTITY FULL)
	tenant   int             // index of the tenant column, -1 when there is none
	unscoped bool            // the table has the tenant column but it is not published (Config.Unscoped)
	entityOp []byte          // `,"entity":"schema.table","op":"`, escaped
	counts   *EntityCounters // decoded changes of entity; nil when skip
}

func newRelation(id uint32, ns, name string, cfg *Config) *relation {
	if ns == "" {
		ns = "pg_catalog" // pgoutput sends "" for pg_catalog
	}
	r := &relation{id: id, entity: EntityName(ns, name), skip: cfg.SkipRelations[id], tenant: -1}
	if !r.skip {
		r.counts = cfg.Counters.Entity(r.entity)
	}
	r.entityOp = append(r.entityOp, `,"entity":`...)
	r.entityOp = appendString(r.entityOp, []byte(r.entity))
	r.entityOp = append(r.entityOp, `,"op":"`...)
	return r
}

func (r *relation) addColumn(name string, key bool, typ colType, cfg *Config) {
	c := column{name: name, key: key, typ: typ}
	c.jsonKey = appendString(nil, []byte(name))
	c.jsonKey = append(c.jsonKey, ':')
	if key {
		r.hasKey = true
	}
	r.fullKey = key && (len(r.cols) == 0 || r.fullKey)
	if cfg.TenantColumn != "" && name == cfg.TenantColumn {
		r.tenant = len(r.cols)
	}
	r.cols = append(r.cols, c)
}

// typeInfo is what a Type message says about a type OID at or above
// FirstGenbkiObjectId. pgoutput (logicalrep_write_typ) sends the column's
// type OID with the namespace and name of its base type: a domain arrives
// named after the type it is over (a domain over int[] as pg_catalog._int4),
// anything else under its own name.
type typeInfo struct {
	ns, name string // ns is "pg_catalog" where pgoutput sent ""
}

// rule is the decoding rule of the type: a pg_catalog type maps to the
// built-in rule by name, so a domain encodes exactly as its base type; a type
// of any other schema — user types, and those initdb creates such as
// information_schema.sql_identifier[] — is never mistaken for a built-in one
// of the same name (see userType).
func (ti typeInfo) rule() colType {
	if ti.ns == "pg_catalog" {
		return catalogType(ti.name)
	}
	return userType(ti.name)
}

// resolveType picks the decoding rule for a column's type OID: the built-in
// rule below FirstGenbkiObjectId, for which pgoutput sends no Type message;
// the rule of the Type message otherwise; text for an OID no Type message
// named.
func (d *Decoder) resolveType(oid uint32) colType {
	if oid < firstGenbkiOID {
		return builtinType(oid)
	}
	if ti, ok := d.types[oid]; ok {
		return ti.rule()
	}
	return colType{kind: kText}
}

// firstGenbkiOID is FirstGenbkiObjectId. OIDs below it are hand-assigned in
// the catalogs and stable across major versions; pgoutput sends a Type
// message for every column type at or above it, including the types initdb
// creates between it and FirstNormalObjectId (16384), such as those of
// information_schema.
const firstGenbkiOID = 10000
