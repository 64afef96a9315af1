package decoder

import "strings"

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
	tenant   int             // index of the tenant column, -1 when there is none
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
	if cfg.TenantColumn != "" && name == cfg.TenantColumn {
		r.tenant = len(r.cols)
	}
	r.cols = append(r.cols, c)
}

// typeInfo is what a Type message says about a non-built-in OID.
type typeInfo struct {
	ns, name string
}

// resolveType picks the decoding rule for a column's type OID: built-in
// rules first, then user types named by Type messages (an array type's name
// starts with '_' and its elements are strings), then text.
func (d *Decoder) resolveType(oid uint32) colType {
	if oid < firstUserOID {
		return builtinType(oid)
	}
	if ti, ok := d.types[oid]; ok && strings.HasPrefix(ti.name, "_") {
		return colType{kind: kArray, elem: kText, delim: ','}
	}
	return colType{kind: kText}
}

// firstUserOID is FirstNormalObjectId: OIDs below it are built in.
const firstUserOID = 16384
