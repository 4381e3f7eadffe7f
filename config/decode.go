package config

import (
	"encoding"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"
)

var (
	durationType        = reflect.TypeFor[time.Duration]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	timeType            = reflect.TypeFor[time.Time]()
)

// Decoder returns the Decoder for a plugin's block raw found at the YAML path
// path (e.g. "sinks.main.config"). The Decoder decodes raw into the struct its
// caller points it at, by the struct's koanf tags (an untagged exported field
// uses its lowercased name; koanf:"-" skips a field; an embedded struct
// without a tag, or tagged ",squash", contributes its fields):
//
//   - strictly: a key with no field is "<path>.<key>: unknown key (known:
//     ...)"; a value of the wrong type is an error at its path; there is no
//     weak typing ("5" does not decode into an int, nor 5 into a string);
//   - a string decodes into a time.Duration with time.ParseDuration and into
//     any type whose pointer implements encoding.TextUnmarshaler with
//     UnmarshalText; both accept only strings;
//   - nested structs, pointers, maps with string keys, slices and arrays are
//     decoded recursively; a slice or array is replaced as a whole, a map is
//     copied and its entries decoded onto the existing ones;
//   - an absent or null key leaves the field untouched, so the caller fills
//     defaults into the struct before decoding; the caller's maps are never
//     modified.
//
// After decoding, the Decoder calls Validate() error on the target if it has
// one, even when decoding failed, so that every problem is reported at once;
// each *FieldError Validate returns (alone, or joined with errors.Join) gets
// path prepended, other errors are reported at path itself, and a Validate
// error at a path that already failed to decode is dropped. All problems come
// back as one Errors, in the order of the file c was loaded from (by path
// when c is nil or not from Load), each at a key a BRIDGE_* variable set
// naming the variable. A target that is not a non-nil pointer is a
// programming error, returned as a plain error.
//
// A value that came from a BRIDGE_* variable or a ${VAR} reference and was
// read as a number or boolean decodes into a string field as its original
// text, so that e.g. a numeric password survives; a variable's value for a
// list of plain values is read as comma-separated items (see Load). This is
// why Decoder is a method of Config. c may be nil.
func (c *Config) Decoder(path string, raw map[string]any) Decoder {
	var texts, env map[string]string
	var o *origin
	if c != nil {
		texts, o = c.texts, c.origin
		if o != nil {
			env = o.env
		}
	}
	return func(into any) error {
		v := reflect.ValueOf(into)
		if v.Kind() != reflect.Pointer || v.IsNil() {
			return fmt.Errorf("config: decoding %s: target must be a non-nil pointer, got %T", path, into)
		}
		d := decoder{texts: texts, env: env}
		if raw != nil {
			d.decode(path, raw, v.Elem())
		}
		if val, ok := into.(interface{ Validate() error }); ok {
			for _, e := range prefixed(path, val.Validate()) {
				if !d.errs.covers(e.Path) {
					d.errs = append(d.errs, e)
				}
			}
		}
		o.blame(d.errs)
		o.order(d.errs)
		return d.errs.err()
	}
}

// decoder decodes a tree of YAML values (maps, lists, scalars) into Go
// values, collecting every problem with its path.
type decoder struct {
	// texts maps a path to the original text of a value read from the
	// environment as a number or boolean (see Config.texts).
	texts map[string]string
	// env maps the path of each value a BRIDGE_* variable set to the
	// variable: such a value may be a comma-separated list.
	env  map[string]string
	errs Errors
}

// decode stores in, the value found at path, into out, which must be
// settable. A nil in leaves out untouched.
func (d *decoder) decode(path string, in any, out reflect.Value) {
	if in == nil {
		return
	}
	t := out.Type()
	inV := reflect.ValueOf(in)
	if k := inV.Kind(); k != reflect.Map && k != reflect.Slice && inV.Type().AssignableTo(t) {
		out.Set(inV) // a scalar of exactly the right type, e.g. a time.Duration override
		return
	}
	if k := t.Kind(); k != reflect.Pointer && k != reflect.Interface && reflect.PointerTo(t).Implements(textUnmarshalerType) {
		d.decodeText(path, in, out)
		return
	}
	if t == durationType {
		d.decodeDuration(path, in, out)
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		elem := reflect.New(t.Elem())
		if !out.IsNil() {
			elem.Elem().Set(out.Elem())
		}
		d.decode(path, in, elem.Elem())
		out.Set(elem)
	case reflect.Interface:
		v := reflect.ValueOf(copyTree(in))
		if !v.Type().AssignableTo(t) {
			d.errs.add(path, "expected a value implementing %s, got %s", t, describe(in))
			return
		}
		out.Set(v)
	case reflect.Struct:
		d.decodeStruct(path, in, out)
	case reflect.Map:
		d.decodeMap(path, in, out)
	case reflect.Slice, reflect.Array:
		d.decodeList(path, in, out)
	case reflect.String:
		s, ok := d.text(path, in)
		if !ok {
			d.errs.add(path, "expected a string, got %s", describe(in))
			return
		}
		out.SetString(s)
	case reflect.Bool:
		if inV.Kind() != reflect.Bool {
			d.errs.add(path, "expected a boolean, got %s", describe(in))
			return
		}
		out.SetBool(inV.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		d.decodeInt(path, inV, out)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		d.decodeUint(path, inV, out)
	case reflect.Float32, reflect.Float64:
		var f float64
		switch inV.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			f = float64(inV.Int())
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
			f = float64(inV.Uint())
		case reflect.Float32, reflect.Float64:
			f = inV.Float()
		default:
			d.errs.add(path, "expected a number, got %s", describe(in))
			return
		}
		if out.OverflowFloat(f) {
			d.errs.add(path, "number out of range for %s", t)
			return
		}
		out.SetFloat(f)
	default:
		d.errs.add(path, "cannot decode into a field of type %s", t)
	}
}

// text returns in as a string: in itself if it is one, or its original text
// if it was read from the environment as a number or boolean.
func (d *decoder) text(path string, in any) (string, bool) {
	if s, ok := in.(string); ok {
		return s, true
	}
	if s, ok := d.texts[path]; ok && reflect.DeepEqual(scalar(s), in) {
		return s, true
	}
	return "", false
}

func (d *decoder) decodeText(path string, in any, out reflect.Value) {
	s, ok := d.text(path, in)
	if !ok {
		d.errs.add(path, "expected a string, got %s", describe(in))
		return
	}
	p := reflect.New(out.Type())
	if err := p.Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(s)); err != nil {
		d.errs.add(path, "%v", err)
		return
	}
	out.Set(p.Elem())
}

func (d *decoder) decodeDuration(path string, in any, out reflect.Value) {
	s, ok := d.text(path, in)
	if !ok {
		d.errs.add(path, `expected a duration such as "50ms" or "2s", got %s`, describe(in))
		return
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		d.errs.add(path, "%v", err)
		return
	}
	out.SetInt(int64(v))
}

func (d *decoder) decodeInt(path string, in, out reflect.Value) {
	var n int64
	switch in.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n = in.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		if in.Uint() > math.MaxInt64 {
			d.errs.add(path, "integer out of range for %s", out.Type())
			return
		}
		n = int64(in.Uint())
	case reflect.Float32, reflect.Float64:
		f := in.Float()
		if f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
			d.errs.add(path, "expected an integer, got a fractional or out-of-range number")
			return
		}
		n = int64(f)
	default:
		d.errs.add(path, "expected an integer, got %s", describe(in.Interface()))
		return
	}
	if out.OverflowInt(n) {
		d.errs.add(path, "integer out of range for %s", out.Type())
		return
	}
	out.SetInt(n)
}

func (d *decoder) decodeUint(path string, in, out reflect.Value) {
	var n uint64
	switch in.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if in.Int() < 0 {
			d.errs.add(path, "expected a non-negative integer, got a negative one")
			return
		}
		n = uint64(in.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		n = in.Uint()
	case reflect.Float32, reflect.Float64:
		f := in.Float()
		if f != math.Trunc(f) || f < 0 || f >= math.MaxUint64 {
			d.errs.add(path, "expected a non-negative integer, got a fractional or out-of-range number")
			return
		}
		n = uint64(f)
	default:
		d.errs.add(path, "expected a non-negative integer, got %s", describe(in.Interface()))
		return
	}
	if out.OverflowUint(n) {
		d.errs.add(path, "integer out of range for %s", out.Type())
		return
	}
	out.SetUint(n)
}

func (d *decoder) decodeStruct(path string, in any, out reflect.Value) {
	m, ok := in.(map[string]any)
	if !ok {
		d.errs.add(path, "expected a mapping, got %s", describe(in))
		return
	}
	fields, names := structFields(out.Type())
	for _, k := range sortedKeys(m) {
		idx, ok := fields[k]
		if !ok {
			known := "none"
			if len(names) > 0 {
				known = strings.Join(names, ", ")
			}
			d.errs.add(joinPath(path, k), "unknown key (known: %s)", known)
			continue
		}
		d.decode(joinPath(path, k), m[k], fieldByIndex(out, idx))
	}
}

func (d *decoder) decodeMap(path string, in any, out reflect.Value) {
	t := out.Type()
	if t.Key().Kind() != reflect.String {
		d.errs.add(path, "cannot decode into a map with %s keys", t.Key())
		return
	}
	m, ok := in.(map[string]any)
	if !ok {
		d.errs.add(path, "expected a mapping, got %s", describe(in))
		return
	}
	dst := reflect.MakeMapWithSize(t, out.Len()+len(m))
	iter := out.MapRange()
	for iter.Next() {
		dst.SetMapIndex(iter.Key(), iter.Value())
	}
	for _, k := range sortedKeys(m) {
		key := reflect.ValueOf(k).Convert(t.Key())
		elem := reflect.New(t.Elem()).Elem()
		if old := dst.MapIndex(key); old.IsValid() {
			elem.Set(old)
		}
		d.decode(joinPath(path, k), m[k], elem)
		dst.SetMapIndex(key, elem)
	}
	out.Set(dst)
}

func (d *decoder) decodeList(path string, in any, out reflect.Value) {
	v := reflect.ValueOf(in)
	if v.Kind() != reflect.Slice && v.Kind() != reflect.Array {
		d.decodeEnvList(path, in, out)
		return
	}
	n := v.Len()
	var dst reflect.Value
	if out.Kind() == reflect.Array {
		if n != out.Len() {
			d.errs.add(path, "expected a list of %d items, got %d", out.Len(), n)
			return
		}
		dst = reflect.New(out.Type()).Elem()
	} else {
		dst = reflect.MakeSlice(out.Type(), n, n)
	}
	for i := range n {
		d.decode(indexPath(path, i), v.Index(i).Interface(), dst.Index(i))
	}
	out.Set(dst)
}

// decodeEnvList decodes in, which is not a list, into the list out: when a
// BRIDGE_* variable set it, as the variable's items (see envList); else it
// is an error, which says how to set a list from the environment when
// variables tried to set its items.
func (d *decoder) decodeEnvList(path string, in any, out reflect.Value) {
	scalars := scalarElem(out.Type().Elem())
	_, fromEnv := d.env[path]
	if !fromEnv {
		for key := range d.env {
			if strings.HasPrefix(key, path+".") {
				how := "set the whole list in the file"
				if scalars {
					how = "set the whole list in one variable, comma-separated, or in the file"
				}
				d.errs.add(path, "expected a list, got %s: list items cannot be set one by one from the environment; %s", describe(in), how)
				return
			}
		}
		d.errs.add(path, "expected a list, got %s", describe(in))
		return
	}
	if !scalars {
		d.errs.add(path, "a list of mappings cannot be set from an environment variable: write it in the file (a value there can be a ${VAR} reference)")
		return
	}
	s, ok := d.text(path, in)
	if !ok {
		d.errs.add(path, "expected a list, got %s", describe(in))
		return
	}
	texts := map[string]string{}
	items, msg := envList(path, s, texts)
	if msg != "" {
		d.errs.add(path, "%s", msg)
		return
	}
	sub := decoder{texts: texts}
	sub.decodeList(path, items, out)
	d.errs = append(d.errs, sub.errs...)
}

// structFields maps each key of struct type t to its field index, following
// the rules in Config.Decoder, and returns the keys sorted. A field declared
// directly in t wins over one promoted from an embedded struct.
func structFields(t reflect.Type) (map[string][]int, []string) {
	fields := map[string][]int{}
	var walk func(t reflect.Type, index []int, depth int, depths map[string]int)
	walk = func(t reflect.Type, index []int, depth int, depths map[string]int) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("koanf"), ",")
			if name == "-" {
				continue
			}
			idx := append(slices.Clone(index), i)
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if f.Anonymous && ft.Kind() == reflect.Struct && (name == "" || slices.Contains(strings.Split(opts, ","), "squash")) {
				walk(ft, idx, depth+1, depths)
				continue
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			if dd, seen := depths[name]; !seen || depth < dd {
				fields[name], depths[name] = idx, depth
			}
		}
	}
	walk(t, nil, 0, map[string]int{})
	return fields, sortedKeys(fields)
}

// fieldByIndex is reflect.Value.FieldByIndex, allocating nil embedded
// pointers on the way.
func fieldByIndex(v reflect.Value, index []int) reflect.Value {
	for i, x := range index {
		if i > 0 && v.Kind() == reflect.Pointer {
			if v.IsNil() {
				v.Set(reflect.New(v.Type().Elem()))
			}
			v = v.Elem()
		}
		v = v.Field(x)
	}
	return v
}

// describe names the YAML kind of v for error messages, without its value,
// which may be a secret.
func describe(v any) string {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Map:
		return "a mapping"
	case reflect.Slice, reflect.Array:
		return "a list"
	}
	if rv.Type() == timeType {
		return "a timestamp (quote it to make it a string)"
	}
	return fmt.Sprintf("a value of type %T", v)
}

// copyTree deep-copies the maps and slices of a YAML value tree.
func copyTree(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = copyTree(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = copyTree(e)
		}
		return out
	default:
		return v
	}
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
