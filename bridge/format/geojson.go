package format

import (
	"encoding/binary"
	"errors"
	"math"
	"strconv"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// appendGeometry appends g as GeoJSON, the way PostGIS' to_jsonb(geometry)
// (ST_AsGeoJSON with every digit) writes it: "type", a "crs" naming
// "EPSG:<srid>" when the value carries an SRID (for geography, only one
// other than 4326, GeoJSON's own), then "coordinates" (x, y and z; m is
// dropped) or, for a collection, "geometries". Empty geometries have empty
// coordinates. Curves, surfaces and TINs, which GeoJSON cannot hold (PostGIS
// refuses them too), and EWKB that does not parse, are the hex EWKB string,
// Postgres' text form.
func appendGeometry(dst []byte, g cdc.Geometry) []byte {
	p := ewkbParser{b: g.EWKB}
	out, err := p.geometry(dst, true, g.Geography)
	if err != nil || p.i != len(p.b) {
		return appendString(dst, g.String())
	}
	return out
}

var errEWKB = errors.New("malformed or unsupported EWKB")

type ewkbParser struct {
	b     []byte
	i     int
	order binary.ByteOrder
	depth int
}

func (p *ewkbParser) u32() (uint32, error) {
	if p.i+4 > len(p.b) {
		return 0, errEWKB
	}
	v := p.order.Uint32(p.b[p.i:])
	p.i += 4
	return v, nil
}

func (p *ewkbParser) f64() (float64, error) {
	if p.i+8 > len(p.b) {
		return 0, errEWKB
	}
	v := math.Float64frombits(p.order.Uint64(p.b[p.i:]))
	p.i += 8
	return v, nil
}

var geoJSONTypes = [...]string{1: "Point", 2: "LineString", 3: "Polygon", 4: "MultiPoint", 5: "MultiLineString", 6: "MultiPolygon", 7: "GeometryCollection"}

// geometry appends one geometry with its header; top is the outermost one,
// the only one that may carry the crs.
func (p *ewkbParser) geometry(dst []byte, top, geography bool) ([]byte, error) {
	if p.depth++; p.depth > 32 || p.i >= len(p.b) {
		return nil, errEWKB
	}
	defer func() { p.depth-- }()
	switch p.b[p.i] {
	case 0:
		p.order = binary.BigEndian
	case 1:
		p.order = binary.LittleEndian
	default:
		return nil, errEWKB
	}
	p.i++
	typ, err := p.u32()
	if err != nil {
		return nil, err
	}
	hasZ, hasM := typ&0x80000000 != 0, typ&0x40000000 != 0
	var srid uint32
	if typ&0x20000000 != 0 {
		if srid, err = p.u32(); err != nil {
			return nil, err
		}
	}
	typ &= 0x0fffffff
	if typ >= 1000 { // ISO WKB: 1000 z, 2000 m, 3000 zm
		hasZ = hasZ || typ/1000 == 1 || typ/1000 == 3
		hasM = hasM || typ/1000 == 2 || typ/1000 == 3
		typ %= 1000
	}
	if typ < 1 || typ > 7 {
		return nil, errEWKB
	}
	dims := 2
	if hasZ {
		dims++
	}
	if hasM {
		dims++
	}
	dst = append(dst, `{"type":"`...)
	dst = append(dst, geoJSONTypes[typ]...)
	dst = append(dst, '"')
	if top && srid != 0 && !(geography && srid == 4326) {
		dst = append(dst, `,"crs":{"type":"name","properties":{"name":"EPSG:`...)
		dst = strconv.AppendUint(dst, uint64(srid), 10)
		dst = append(dst, `"}}`...)
	}
	if typ == 7 {
		dst = append(dst, `,"geometries":[`...)
	} else {
		dst = append(dst, `,"coordinates":`...)
	}
	switch typ {
	case 1:
		dst, err = p.point(dst, dims, hasZ, true)
	case 2:
		dst, err = p.points(dst, dims, hasZ)
	case 3:
		dst, err = p.rings(dst, dims, hasZ)
	case 4, 5, 6, 7:
		var n uint32
		if n, err = p.u32(); err != nil {
			return nil, err
		}
		if typ != 7 {
			dst = append(dst, '[')
		}
		order := p.order
		for k := uint32(0); k < n && err == nil; k++ {
			if k > 0 {
				dst = append(dst, ',')
			}
			if typ == 7 {
				dst, err = p.geometry(dst, false, geography)
			} else {
				dst, err = p.member(dst, int(typ)-3)
			}
			p.order = order
		}
		dst = append(dst, ']')
	}
	if err != nil {
		return nil, err
	}
	return append(dst, '}'), nil
}

// member appends the coordinates of one member of a multi-geometry, which
// must be a single geometry of the kind want (1 point, 2 line, 3 polygon).
func (p *ewkbParser) member(dst []byte, want int) ([]byte, error) {
	if p.i >= len(p.b) || p.b[p.i] > 1 {
		return nil, errEWKB
	}
	p.order = binary.ByteOrder(binary.BigEndian)
	if p.b[p.i] == 1 {
		p.order = binary.LittleEndian
	}
	p.i++
	typ, err := p.u32()
	if err != nil {
		return nil, err
	}
	hasZ, hasM := typ&0x80000000 != 0, typ&0x40000000 != 0
	if typ&0x20000000 != 0 {
		if _, err := p.u32(); err != nil {
			return nil, err
		}
	}
	typ &= 0x0fffffff
	if typ >= 1000 {
		hasZ = hasZ || typ/1000 == 1 || typ/1000 == 3
		hasM = hasM || typ/1000 == 2 || typ/1000 == 3
		typ %= 1000
	}
	if int(typ) != want {
		return nil, errEWKB
	}
	dims := 2
	if hasZ {
		dims++
	}
	if hasM {
		dims++
	}
	switch want {
	case 1:
		return p.point(dst, dims, hasZ, true)
	case 2:
		return p.points(dst, dims, hasZ)
	}
	return p.rings(dst, dims, hasZ)
}

// point appends one position, [x,y] or [x,y,z]; an empty point (every
// ordinate NaN) is [] when alone.
func (p *ewkbParser) point(dst []byte, dims int, hasZ, alone bool) ([]byte, error) {
	var c [4]float64
	empty := true
	for k := range dims {
		v, err := p.f64()
		if err != nil {
			return nil, err
		}
		c[k] = v
		empty = empty && math.IsNaN(v)
	}
	if empty && alone {
		return append(dst, "[]"...), nil
	}
	n := 2
	if hasZ {
		n = 3
	}
	dst = append(dst, '[')
	for k := range n {
		if k > 0 {
			dst = append(dst, ',')
		}
		dst = appendFloat(dst, c[k], 64)
	}
	return append(dst, ']'), nil
}

func (p *ewkbParser) points(dst []byte, dims int, hasZ bool) ([]byte, error) {
	n, err := p.u32()
	if err != nil {
		return nil, err
	}
	if uint64(n)*uint64(dims)*8 > uint64(len(p.b)-p.i) {
		return nil, errEWKB
	}
	dst = append(dst, '[')
	for k := uint32(0); k < n; k++ {
		if k > 0 {
			dst = append(dst, ',')
		}
		if dst, err = p.point(dst, dims, hasZ, false); err != nil {
			return nil, err
		}
	}
	return append(dst, ']'), nil
}

func (p *ewkbParser) rings(dst []byte, dims int, hasZ bool) ([]byte, error) {
	n, err := p.u32()
	if err != nil {
		return nil, err
	}
	if uint64(n)*4 > uint64(len(p.b)-p.i) {
		return nil, errEWKB
	}
	dst = append(dst, '[')
	for k := uint32(0); k < n; k++ {
		if k > 0 {
			dst = append(dst, ',')
		}
		if dst, err = p.points(dst, dims, hasZ); err != nil {
			return nil, err
		}
	}
	return append(dst, ']'), nil
}
