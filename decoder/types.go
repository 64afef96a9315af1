package decoder

// ArrayElement describes the element type of an array type that pgoutput
// names only as "_name", outside pg_catalog: an array of a domain, enum,
// composite or other type not built in. Config.ArrayElement and
// ColumnInfo.Element supply it from the catalog, so that an array of a
// domain encodes its elements exactly as the domain's base type (DESIGN §3):
// posnum[], posnum a domain over numeric, is [42.5], not ["42.5"].
type ArrayElement struct {
	// Schema and Name are the element type's base type, the end of its
	// chain of domains ("pg_catalog" for a built-in one).
	Schema, Name string
	// Delim is the element type's array delimiter (pg_type.typdelim); 0
	// means ','.
	Delim byte
}

// rule is the decoding rule of an array of e.
func (e ArrayElement) rule() colType {
	ns := e.Schema
	if ns == "" {
		ns = "pg_catalog"
	}
	elem := typeInfo{ns: ns, name: e.Name}.rule().kind
	if elem == kArray {
		// An element that is itself an array (of a domain over an
		// array) is written as a string of its text, as its array's
		// parser cannot tell its nesting.
		elem = kText
	}
	d := e.Delim
	if d == 0 {
		d = ','
	}
	return colType{kind: kArray, elem: elem, delim: d}
}

// columnType is the decoding rule for a column of type oid: resolveType's,
// unless an ArrayElement is known for it.
func (d *Decoder) columnType(oid uint32) colType {
	if e, ok := d.elems[oid]; ok {
		return e.rule()
	}
	return d.resolveType(oid)
}

// learnElement asks Config.ArrayElement about the array type a Type message
// named ti (oid), when it is one outside pg_catalog.
func (d *Decoder) learnElement(oid uint32, ti typeInfo) error {
	delete(d.elems, oid)
	if d.cfg.ArrayElement == nil || ti.ns == "pg_catalog" || len(ti.name) == 0 || ti.name[0] != '_' {
		return nil
	}
	e, ok, err := d.cfg.ArrayElement(oid)
	if err != nil || !ok {
		return err
	}
	if d.elems == nil {
		d.elems = make(map[uint32]ArrayElement)
	}
	d.elems[oid] = e
	return nil
}
