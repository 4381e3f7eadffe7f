package pgtypes

// builtinKinds gives the Kind of base types in pg_catalog by typname; the
// rest are Text.
var builtinKinds = map[string]Kind{
	"bool":        Bool,
	"int2":        Int,
	"int4":        Int,
	"int8":        Int,
	"oid":         Int,
	"float4":      Float,
	"float8":      Float,
	"numeric":     Numeric,
	"bytea":       Bytea,
	"json":        JSON,
	"jsonb":       JSON,
	"timestamptz": TimestampTZ,
	"timestamp":   Timestamp,
	"date":        Date,
}

// builtinList holds built-in base types and their array types. Their OIDs
// are fixed across PostgreSQL versions; TestBuiltinsMatchCatalog checks the
// table against a real server.
var builtinList = []struct {
	oid, array uint32
	name       string
	delim      byte
}{
	{16, 1000, "bool", ','},
	{17, 1001, "bytea", ','},
	{18, 1002, "char", ','},
	{19, 1003, "name", ','},
	{20, 1016, "int8", ','},
	{21, 1005, "int2", ','},
	{22, 1006, "int2vector", ','},
	{23, 1007, "int4", ','},
	{24, 1008, "regproc", ','},
	{25, 1009, "text", ','},
	{26, 1028, "oid", ','},
	{27, 1010, "tid", ','},
	{28, 1011, "xid", ','},
	{29, 1012, "cid", ','},
	{30, 1013, "oidvector", ','},
	{114, 199, "json", ','},
	{142, 143, "xml", ','},
	{600, 1017, "point", ','},
	{601, 1018, "lseg", ','},
	{602, 1019, "path", ','},
	{603, 1020, "box", ';'},
	{604, 1027, "polygon", ','},
	{628, 629, "line", ','},
	{650, 651, "cidr", ','},
	{700, 1021, "float4", ','},
	{701, 1022, "float8", ','},
	{718, 719, "circle", ','},
	{774, 775, "macaddr8", ','},
	{790, 791, "money", ','},
	{829, 1040, "macaddr", ','},
	{869, 1041, "inet", ','},
	{1033, 1034, "aclitem", ','},
	{1042, 1014, "bpchar", ','},
	{1043, 1015, "varchar", ','},
	{1082, 1182, "date", ','},
	{1083, 1183, "time", ','},
	{1114, 1115, "timestamp", ','},
	{1184, 1185, "timestamptz", ','},
	{1186, 1187, "interval", ','},
	{1266, 1270, "timetz", ','},
	{1560, 1561, "bit", ','},
	{1562, 1563, "varbit", ','},
	{1700, 1231, "numeric", ','},
	{2202, 2207, "regprocedure", ','},
	{2203, 2208, "regoper", ','},
	{2204, 2209, "regoperator", ','},
	{2205, 2210, "regclass", ','},
	{2206, 2211, "regtype", ','},
	{2950, 2951, "uuid", ','},
	{3220, 3221, "pg_lsn", ','},
	{3614, 3643, "tsvector", ','},
	{3615, 3645, "tsquery", ','},
	{3734, 3735, "regconfig", ','},
	{3769, 3770, "regdictionary", ','},
	{3802, 3807, "jsonb", ','},
	{3904, 3905, "int4range", ','},
	{3906, 3907, "numrange", ','},
	{3908, 3909, "tsrange", ','},
	{3910, 3911, "tstzrange", ','},
	{3912, 3913, "daterange", ','},
	{3926, 3927, "int8range", ','},
	{4072, 4073, "jsonpath", ','},
	{4089, 4090, "regnamespace", ','},
	{4096, 4097, "regrole", ','},
	{4191, 4192, "regcollation", ','},
	{4451, 6150, "int4multirange", ','},
	{4532, 6151, "nummultirange", ','},
	{4533, 6152, "tsmultirange", ','},
	{4534, 6153, "tstzmultirange", ','},
	{4535, 6155, "datemultirange", ','},
	{4536, 6157, "int8multirange", ','},
	{5038, 5039, "pg_snapshot", ','},
	{5069, 271, "xid8", ','},
}

// builtins maps the OIDs of builtinList to their Types. It is filled once
// and only read afterwards.
var builtins = func() map[uint32]*Type {
	m := make(map[uint32]*Type, 2*len(builtinList))
	for _, b := range builtinList {
		t := &Type{OID: b.oid, Name: b.name, Kind: builtinKinds[b.name], Delim: b.delim}
		m[b.oid] = t
		m[b.array] = &Type{OID: b.array, Name: "_" + b.name, Kind: Array, Elem: t, Delim: b.delim}
	}
	return m
}()
